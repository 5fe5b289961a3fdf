package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/kerrors"
)

// StreamIO is the caller's side of an exec, attach or run stream.
type StreamIO struct {
	// Stdin, when set, is sent to the process; its EOF closes the
	// process's stdin.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Resize delivers terminal size changes (tty only).
	Resize <-chan podtypes.TermSize
	// OnPod is called with the pod a run created, before any output.
	OnPod func(*podtypes.Pod)
}

// RunPod creates a pod and waits for its first app (req.Wait is forced),
// streaming its output; it returns the pod and the app's exit code. With
// req.Remove the daemon removes the pod before answering.
func (c *Client) RunPod(ctx context.Context, req wire.CreatePodRequest, sio StreamIO) (*podtypes.Pod, int, error) {
	req.Wait = true
	req.Stdin = sio.Stdin != nil
	var created *podtypes.Pod
	onPod := sio.OnPod
	sio.OnPod = func(p *podtypes.Pod) {
		created = p
		if onPod != nil {
			onPod(p)
		}
	}
	code, err := c.stream(ctx, "/pods", req, sio)
	return created, code, err
}

// Exec runs a command in an app of a pod and returns its exit code.
func (c *Client) Exec(ctx context.Context, ref string, req wire.ExecRequest, sio StreamIO) (int, error) {
	req.Stdin = sio.Stdin != nil
	return c.stream(ctx, podPath(ref, "/exec"), req, sio)
}

// Attach connects to an app's stdio until either side closes; it returns
// the app's exit code when it has exited, else 0.
func (c *Client) Attach(ctx context.Context, ref string, req wire.AttachRequest, sio StreamIO) (int, error) {
	req.Stdin = sio.Stdin != nil
	return c.stream(ctx, podPath(ref, "/attach"), req, sio)
}

func (c *Client) stream(ctx context.Context, path string, body any, sio StreamIO) (int, error) {
	x, resp, err := c.call(ctx, "POST", path, nil, body, true)
	if err != nil {
		return 0, err
	}
	rwc := x
	defer rwc.Close()
	if resp.code != 101 {
		return 0, fmt.Errorf("kurmad answered %s instead of switching protocols", resp.status)
	}
	fw := wire.NewFrameWriter(rwc)
	if sio.Stdin != nil {
		go func() {
			_, _ = io.Copy(fw.Stream(wire.FrameStdin), sio.Stdin)
			_ = fw.Control(wire.Control{Type: "stdin-close"})
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
					if fw.Control(wire.Control{Type: "resize", Rows: ts.Rows, Cols: ts.Cols}) != nil {
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
		kind, p, err := wire.ReadFrame(rwc)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, kerrors.New(kerrors.Unavailable, "stream closed before an exit status: %v", err)
		}
		switch kind {
		case wire.FrameStdout:
			if _, err := stdout.Write(p); err != nil {
				return 0, fmt.Errorf("write stdout: %w", err)
			}
		case wire.FrameStderr:
			if _, err := stderr.Write(p); err != nil {
				return 0, fmt.Errorf("write stderr: %w", err)
			}
		case wire.FrameControl:
			ctl, err := wire.DecodeControl(p)
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
				return 0, ctl.Error.Err()
			}
		}
	}
}
