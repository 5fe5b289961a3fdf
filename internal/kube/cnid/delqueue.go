package cnid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kurma.dev/kurma/internal/kube/cniwire"
)

// drainDelQueueEvery carries out the queued DELs now and then every
// interval, until ctx ends. The shim queues a DEL only while the socket
// does not answer, so one round at start finds almost all of them; the
// later rounds pick up a DEL queued in the instant between a failed dial
// and the listener's start, and retry those that failed.
func (d *Daemon) drainDelQueueEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.drainDelQueue(ctx)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// drainDelQueue carries out every DEL in the queue once; a DEL that fails
// stays for the next round, a file that is not a queued DEL is removed.
func (d *Daemon) drainDelQueue(ctx context.Context) {
	dir := cniwire.DelQueue(d.cfg.Socket)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("cnid: DEL queue", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range ents {
		if ctx.Err() != nil {
			return
		}
		path := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			// A shim that died between write and rename.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				_ = os.Remove(path)
			}
			continue
		}
		req, err := readQueued(path)
		if err != nil {
			d.log.Warn("cnid: dropping an unreadable DEL queue file", "file", path, "err", err)
			_ = os.Remove(path)
			continue
		}
		resp := d.Handle(ctx, req)
		if resp.ExitCode != 0 {
			d.log.Warn("cnid: queued DEL failed; kept for the next round", "container", req.Env["CNI_CONTAINERID"],
				"answer", strings.TrimSpace(string(resp.Stdout)))
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("cnid: DEL queue", "file", path, "err", err)
		}
		d.log.Info("cnid: queued DEL carried out", "container", req.Env["CNI_CONTAINERID"], "ifname", req.Env["CNI_IFNAME"])
	}
}

// readQueued reads one queued DEL.
func readQueued(path string) (*cniwire.Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, cniwire.MaxMessage+1))
	if err != nil {
		return nil, err
	}
	return parseQueued(filepath.Base(path), b)
}

// parseQueued decodes a queued DEL and checks that it is one, made for
// the container and interface its file is named after.
func parseQueued(name string, b []byte) (*cniwire.Request, error) {
	if len(b) > cniwire.MaxMessage {
		return nil, fmt.Errorf("over %d bytes", cniwire.MaxMessage)
	}
	var req cniwire.Request
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if cmd := req.Env["CNI_COMMAND"]; cmd != "DEL" {
		return nil, fmt.Errorf("CNI_COMMAND %q, want DEL", cmd)
	}
	if want := cniwire.QueueFile(req.Env["CNI_CONTAINERID"], req.Env["CNI_IFNAME"]); want == "" || want != name {
		return nil, fmt.Errorf("container %q interface %q do not match the file name", req.Env["CNI_CONTAINERID"], req.Env["CNI_IFNAME"])
	}
	return &req, nil
}
