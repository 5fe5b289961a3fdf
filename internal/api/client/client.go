// Package client is the Go client of kurmad's API (internal/api), for the
// kurma CLI: the same versioned HTTP/JSON over the daemon's unix socket.
//
// It speaks HTTP/1.1 itself (http.go) instead of using net/http, because
// linking net/http brings crypto/tls, crypto/x509 and the rest of the
// crypto packages into the CLI, and their package initialisation and page
// faults cost every kurma command at start-up (docs/api.md, "The CLI's
// client", has the measured figures). What it needs of
// HTTP is small and fixed: one request per connection, JSON bodies,
// Content-Length, chunked and upgraded responses, trailers.
//
// It must never import net/http, internal/api (the server), internal/pod
// (the runtime) or anything else with start-up cost; internal/cli's
// TestCLIDoesNotLinkTheStore holds the CLI to that.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"kurma.dev/kurma/internal/api/wire"
	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

const upgradeProtocol = wire.UpgradeProtocol

// Client talks to kurmad over its unix socket. Errors the daemon reports
// come back in their kerrors category; a daemon that cannot be reached is
// kerrors.Unavailable. It is safe for concurrent use.
type Client struct {
	socket string
}

// New returns a client for the daemon listening on socket.
func New(socket string) *Client { return &Client{socket: socket} }

// Close releases nothing (each call has its own connection); it is kept
// so callers need not know.
func (c *Client) Close() {}

// target is the request target of an API path with its query.
func target(path string, q url.Values) string {
	t := "/" + wire.Version + path
	if len(q) > 0 {
		t += "?" + q.Encode()
	}
	return t
}

// call sends a request (body encoded as JSON unless nil) and returns the
// exchange and response for a status below 400, else the daemon's error.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body any, upgrade bool) (*exchange, *response, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, nil, fmt.Errorf("encode request: %w", err)
		}
	}
	x, resp, err := c.roundTrip(ctx, method, target(path, q), b, upgrade)
	if err != nil {
		return nil, nil, err
	}
	if resp.code >= 400 {
		defer x.Close()
		return nil, nil, decodeError(resp)
	}
	return x, resp, nil
}

func decodeError(resp *response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.body, wire.MaxBodyBytes))
	var eb wire.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Type == "" {
		return fmt.Errorf("kurmad answered %s: %s", resp.status, strings.TrimSpace(string(b)))
	}
	return eb.Error.Err()
}

// do runs a JSON call; out may be nil.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	x, resp, err := c.call(ctx, method, path, q, body, false)
	if err != nil {
		return err
	}
	defer x.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.body)
		return nil
	}
	if err := json.NewDecoder(resp.body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("decode %s %s response: %w", method, path, err)
	}
	return nil
}

func podPath(ref string, rest string) string { return "/pods/" + url.PathEscape(ref) + rest }

// Version asks the daemon for its version.
func (c *Client) Version(ctx context.Context) (wire.VersionInfo, error) {
	var v wire.VersionInfo
	err := c.do(ctx, "GET", "/version", nil, nil, &v)
	return v, err
}

// CreatePod creates and starts a pod and returns it once running.
func (c *Client) CreatePod(ctx context.Context, spec podtypes.Spec) (*podtypes.Pod, error) {
	var p podtypes.Pod
	if err := c.do(ctx, "POST", "/pods", nil, wire.CreatePodRequest{Spec: spec}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListPods lists every pod the daemon knows.
func (c *Client) ListPods(ctx context.Context) ([]*podtypes.Pod, error) {
	var ps []*podtypes.Pod
	err := c.do(ctx, "GET", "/pods", nil, nil, &ps)
	return ps, err
}

// GetPod finds a pod by UUID, UUID prefix or name.
func (c *Client) GetPod(ctx context.Context, ref string) (*podtypes.Pod, error) {
	var p podtypes.Pod
	if err := c.do(ctx, "GET", podPath(ref, ""), nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// StopPod stops a pod; a negative grace means the daemon's default.
func (c *Client) StopPod(ctx context.Context, ref string, graceSeconds int) error {
	return c.do(ctx, "POST", podPath(ref, "/stop"), nil, wire.StopRequest{GraceSeconds: graceSeconds}, nil)
}

// RemovePod removes a stopped pod, or any pod with force.
func (c *Client) RemovePod(ctx context.Context, ref string, force bool) error {
	q := url.Values{}
	if force {
		q.Set("force", "true")
	}
	return c.do(ctx, "DELETE", podPath(ref, ""), q, nil, nil)
}

// PodStatus runs the pod's status call-in.
func (c *Client) PodStatus(ctx context.Context, ref string) (stagerspec.Status, error) {
	var st stagerspec.Status
	err := c.do(ctx, "GET", podPath(ref, "/status"), nil, nil, &st)
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
	x, resp, err := c.call(ctx, "GET", podPath(ref, "/logs"), q, nil, false)
	if err != nil {
		return err
	}
	defer x.Close()
	if _, err := io.Copy(w, resp.body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("read logs: %w", err)
	}
	if t := resp.trailer.Get(wire.ErrorTrailer); t != "" {
		var eb wire.ErrorBody
		if err := json.Unmarshal([]byte(t), &eb); err == nil {
			return eb.Error.Err()
		}
		return errors.New(t)
	}
	return nil
}

// Pull fetches an image through the daemon, calling progress (when set)
// for each progress event.
func (c *Client) Pull(ctx context.Context, uri string, insecure bool, progress func(image.Progress)) (*image.Image, error) {
	x, resp, err := c.call(ctx, "POST", "/images/pull", nil, wire.PullRequest{URI: uri, Insecure: insecure}, false)
	if err != nil {
		return nil, err
	}
	defer x.Close()
	dec := json.NewDecoder(resp.body)
	for {
		var ev wire.PullEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, kerrors.New(kerrors.Unavailable, "pull %s: stream ended without a result", uri)
			}
			return nil, fmt.Errorf("pull %s: read progress: %w", uri, err)
		}
		switch {
		case ev.Error != nil:
			return nil, ev.Error.Err()
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
	err := c.do(ctx, "GET", "/images", nil, nil, &imgs)
	return imgs, err
}

// GetImage finds an image by ID, reference or ID prefix.
func (c *Client) GetImage(ctx context.Context, ref string) (*image.Image, error) {
	var img image.Image
	if err := c.do(ctx, "GET", "/images/"+url.PathEscape(ref), nil, nil, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// RemoveImage removes an image and its unused layers.
func (c *Client) RemoveImage(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/images/"+url.PathEscape(ref), nil, nil, nil)
}

// ListNetworks lists the daemon's pod networks and their states.
func (c *Client) ListNetworks(ctx context.Context) ([]wire.NetworkInfo, error) {
	var nets []wire.NetworkInfo
	err := c.do(ctx, "GET", "/networks", nil, nil, &nets)
	return nets, err
}
