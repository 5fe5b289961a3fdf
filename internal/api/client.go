package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/kerrors"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/stagerspec"
)

// Client talks to kurmad over its unix socket. Errors the daemon reports
// come back in their kerrors category; a daemon that cannot be reached is
// kerrors.Unavailable.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon listening on socket.
func NewClient(socket string) *Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:      4,
		IdleConnTimeout:   30 * time.Second,
		DisableKeepAlives: false,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	u := "http://kurma/" + Version + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if req.Context().Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, req.Context().Err())
		}
		return nil, kerrors.New(kerrors.Unavailable, "cannot reach kurmad at %s: %v", c.socket, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeErrorResponse(resp)
	}
	return resp, nil
}

func decodeErrorResponse(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes))
	var eb ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Type == "" {
		return fmt.Errorf("kurmad answered %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return eb.Error.asError()
}

// do runs a JSON call; out may be nil.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

func podPath(ref string, rest string) string { return "/pods/" + url.PathEscape(ref) + rest }

// Version asks the daemon for its version.
func (c *Client) Version(ctx context.Context) (VersionInfo, error) {
	var v VersionInfo
	err := c.do(ctx, http.MethodGet, "/version", nil, nil, &v)
	return v, err
}

// CreatePod creates and starts a pod and returns it once running.
func (c *Client) CreatePod(ctx context.Context, spec pod.Spec) (*pod.Pod, error) {
	var p pod.Pod
	if err := c.do(ctx, http.MethodPost, "/pods", nil, CreatePodRequest{Spec: spec}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListPods lists every pod the daemon knows.
func (c *Client) ListPods(ctx context.Context) ([]*pod.Pod, error) {
	var ps []*pod.Pod
	err := c.do(ctx, http.MethodGet, "/pods", nil, nil, &ps)
	return ps, err
}

// GetPod finds a pod by UUID, UUID prefix or name.
func (c *Client) GetPod(ctx context.Context, ref string) (*pod.Pod, error) {
	var p pod.Pod
	if err := c.do(ctx, http.MethodGet, podPath(ref, ""), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// StopPod stops a pod; a negative grace means the daemon's default.
func (c *Client) StopPod(ctx context.Context, ref string, graceSeconds int) error {
	return c.do(ctx, http.MethodPost, podPath(ref, "/stop"), nil, StopRequest{GraceSeconds: graceSeconds}, nil)
}

// RemovePod removes a stopped pod, or any pod with force.
func (c *Client) RemovePod(ctx context.Context, ref string, force bool) error {
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	return c.do(ctx, http.MethodDelete, podPath(ref, ""), q, nil, nil)
}

// PodStatus runs the pod's status call-in.
func (c *Client) PodStatus(ctx context.Context, ref string) (stagerspec.Status, error) {
	var st stagerspec.Status
	err := c.do(ctx, http.MethodGet, podPath(ref, "/status"), nil, nil, &st)
	return st, err
}

// Logs copies an app's log to w ("" app: the pod's only app), following it
// when follow is set until the app exits or ctx ends.
func (c *Client) Logs(ctx context.Context, ref, app string, follow bool, w io.Writer) error {
	q := url.Values{}
	if app != "" {
		q.Set("app", app)
	}
	if follow {
		q.Set("follow", "true")
	}
	req, err := c.newRequest(ctx, http.MethodGet, podPath(ref, "/logs"), q, nil)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("read logs: %w", err)
	}
	if t := resp.Trailer.Get(ErrorTrailer); t != "" {
		var eb ErrorBody
		if err := json.Unmarshal([]byte(t), &eb); err == nil {
			return eb.Error.asError()
		}
		return errors.New(t)
	}
	return nil
}

// Pull fetches an image through the daemon, calling progress (when set)
// for each progress event.
func (c *Client) Pull(ctx context.Context, uri string, insecure bool, progress func(image.Progress)) (*image.Image, error) {
	req, err := c.newRequest(ctx, http.MethodPost, "/images/pull", nil, PullRequest{URI: uri, Insecure: insecure})
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev PullEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, kerrors.New(kerrors.Unavailable, "pull %s: stream ended without a result", uri)
			}
			return nil, fmt.Errorf("pull %s: read progress: %w", uri, err)
		}
		switch {
		case ev.Error != nil:
			return nil, ev.Error.asError()
		case ev.Image != nil:
			return ev.Image, nil
		case ev.Progress != nil && progress != nil:
			progress(*ev.Progress)
		}
	}
}

// ListImages lists the app images in the store.
func (c *Client) ListImages(ctx context.Context) ([]*image.Image, error) {
	var imgs []*image.Image
	err := c.do(ctx, http.MethodGet, "/images", nil, nil, &imgs)
	return imgs, err
}

// GetImage finds an image by ID, reference or ID prefix.
func (c *Client) GetImage(ctx context.Context, ref string) (*image.Image, error) {
	var img image.Image
	if err := c.do(ctx, http.MethodGet, "/images/"+url.PathEscape(ref), nil, nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// RemoveImage removes an image and its unused layers.
func (c *Client) RemoveImage(ctx context.Context, ref string) error {
	return c.do(ctx, http.MethodDelete, "/images/"+url.PathEscape(ref), nil, nil, nil)
}
