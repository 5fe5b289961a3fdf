package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"kurma.dev/kurma/internal/kerrors"
	"kurma.dev/kurma/internal/pod"
)

// StreamIO is the caller's side of an exec, attach or run stream.
type StreamIO struct {
	// Stdin, when set, is sent to the process; its EOF closes the
	// process's stdin.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Resize delivers terminal size changes (tty only).
	Resize <-chan pod.TermSize
	// OnPod is called with the pod a run created, before any output.
	OnPod func(*pod.Pod)
}

// RunPod creates a pod and waits for its first app (req.Wait is forced),
// streaming its output; it returns the pod and the app's exit code. With
// req.Remove the daemon removes the pod before answering.
func (c *Client) RunPod(ctx context.Context, req CreatePodRequest, sio StreamIO) (*pod.Pod, int, error) {
	req.Wait = true
	req.Stdin = sio.Stdin != nil
	var created *pod.Pod
	onPod := sio.OnPod
	sio.OnPod = func(p *pod.Pod) {
		created = p
		if onPod != nil {
			onPod(p)
		}
	}
	code, err := c.stream(ctx, "/pods", req, sio)
	return created, code, err
}

// Exec runs a command in an app of a pod and returns its exit code.
func (c *Client) Exec(ctx context.Context, ref string, req ExecRequest, sio StreamIO) (int, error) {
	req.Stdin = sio.Stdin != nil
	return c.stream(ctx, podPath(ref, "/exec"), req, sio)
}

// Attach connects to an app's stdio until either side closes; it returns
// the app's exit code when it has exited, else 0.
func (c *Client) Attach(ctx context.Context, ref string, req AttachRequest, sio StreamIO) (int, error) {
	req.Stdin = sio.Stdin != nil
	return c.stream(ctx, podPath(ref, "/attach"), req, sio)
}

func (c *Client) stream(ctx context.Context, path string, body any, sio StreamIO) (int, error) {
	req, err := c.newRequest(ctx, http.MethodPost, path, nil, body)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", UpgradeProtocol)
	resp, err := c.send(req)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		return 0, fmt.Errorf("kurmad answered %s instead of switching protocols", resp.Status)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return 0, errors.New("upgraded connection is not writable")
	}
	defer rwc.Close()
	stop := context.AfterFunc(ctx, func() { _ = rwc.Close() })
	defer stop()

	fw := &frameWriter{w: rwc}
	if sio.Stdin != nil {
		go func() {
			_, _ = io.Copy(fw.stream(FrameStdin), sio.Stdin)
			_ = fw.control(Control{Type: "stdin-close"})
		}()
	}
	if sio.Resize != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ts, ok := <-sio.Resize:
					if !ok {
						return
					}
					if fw.control(Control{Type: "resize", Rows: ts.Rows, Cols: ts.Cols}) != nil {
						return
					}
				}
			}
		}()
	}
	stdout, stderr := sio.Stdout, sio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		kind, p, err := readFrame(rwc)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, kerrors.New(kerrors.Unavailable, "stream closed before an exit status: %v", err)
		}
		switch kind {
		case FrameStdout:
			if _, err := stdout.Write(p); err != nil {
				return 0, fmt.Errorf("write stdout: %w", err)
			}
		case FrameStderr:
			if _, err := stderr.Write(p); err != nil {
				return 0, fmt.Errorf("write stderr: %w", err)
			}
		case FrameControl:
			ctl, err := decodeControl(p)
			if err != nil {
				return 0, err
			}
			switch ctl.Type {
			case "pod":
				if ctl.Pod != nil && sio.OnPod != nil {
					sio.OnPod(ctl.Pod)
				}
			case "exit":
				return ctl.Code, nil
			case "error":
				if ctl.Error == nil {
					return 0, errors.New("stream failed")
				}
				return 0, ctl.Error.asError()
			}
		}
	}
}
