package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func defaultExe() string {
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		return ""
	}
	p := filepath.Join(dir, "kurma-controller")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

type controllerProc struct {
	cmd *exec.Cmd
}

// startController runs the binary on the bbolt file and returns its URL
// (read from its "controller listening" log line).
func startController(ctx context.Context, exe, db string, noSync bool) (*controllerProc, string, error) {
	if noSync {
		fmt.Println("note: -nosync does not apply to the separate controller process (it always fsyncs)")
	}
	cmd := exec.Command(exe, "--listen", "127.0.0.1:0", "--store", "bolt:"+db, "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", exe, err)
	}
	p := &controllerProc{cmd: cmd}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "controller listening" {
				addr <- m.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return p, "http://" + a, nil
	case <-time.After(60 * time.Second):
		p.stop()
		return nil, "", fmt.Errorf("%s did not start", exe)
	case <-ctx.Done():
		p.stop()
		return nil, "", ctx.Err()
	}
}

// stop ends the process (by its PID) gracefully, then for good.
func (p *controllerProc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// cpuSeconds reads the process's user+system time from /proc.
func (p *controllerProc) cpuSeconds() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// waitCountedHTTP waits until the controller's ports gauge covers n ports.
func waitCountedHTTP(url string, n int) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			sum := 0.0
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "kurma_controller_ports{") {
					if i := strings.LastIndexByte(line, ' '); i > 0 {
						v, _ := strconv.ParseFloat(line[i+1:], 64)
						sum += v
					}
				}
			}
			if sum >= float64(n) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}
