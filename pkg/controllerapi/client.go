package controllerapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

// ErrCompacted is returned (wrapped) by a watch whose since revision the
// store has compacted away (HTTP 410). Re-list by watching with since=0.
var ErrCompacted = errors.New("watch revision compacted")

// Client talks to one controller. Safe for concurrent use.
type Client struct {
	base  string // without trailing slash
	token string
	hc    *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends "Authorization: Bearer <token>" on every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient replaces the default http.Client (which has no overall
// timeout, since watches and long polls are long-lived; use contexts).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTLSConfig uses cfg for https base URLs.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *Client) {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		c.hc = &http.Client{Transport: tr}
	}
}

// New returns a client for the controller at baseURL (the CNI config's
// mpurl, e.g. "http://127.0.0.1:9696").
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, kerrors.New(kerrors.Invalid, "controller url %q: want http(s)://host[:port][/path]", baseURL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{Transport: tr}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

func esc(s string) string { return url.PathEscape(s) }

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	u := c.base + "/" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// decodeError turns a non-2xx response into a categorised error.
func decodeError(method, path string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
		if resp.StatusCode == http.StatusGone {
			return fmt.Errorf("%s %s: %s: %w", method, path, eb.Error.Message, ErrCompacted)
		}
		return fmt.Errorf("%s %s: %w", method, path, kerrors.FromType(eb.Error.Type, eb.Error.Message))
	}
	var cat error
	switch resp.StatusCode {
	case http.StatusGone:
		return fmt.Errorf("%s %s: %w", method, path, ErrCompacted)
	case http.StatusNotFound:
		cat = kerrors.NotFound
	case http.StatusConflict:
		cat = kerrors.Conflict
	case http.StatusBadRequest:
		cat = kerrors.Invalid
	case http.StatusUnauthorized, http.StatusForbidden:
		cat = kerrors.Unauthorized
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		cat = kerrors.Unavailable
	case http.StatusGatewayTimeout:
		cat = kerrors.Timeout
	default:
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return fmt.Errorf("%s %s: HTTP %d: %w", method, path, resp.StatusCode, kerrors.New(cat, "%s", bytes.TrimSpace(b)))
}

// do sends the request and decodes a JSON response into out (if non-nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	req, err := c.newRequest(ctx, method, path, q, in)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		return fmt.Errorf("%s %s: %w", method, path, kerrors.New(kerrors.Unavailable, "%v", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(method, path, resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	return nil
}

// Projects.

func (c *Client) CreateProject(ctx context.Context, p Project) (*Project, error) {
	var out ProjectBody
	if err := c.do(ctx, http.MethodPost, "projects", nil, ProjectBody{p}, &out); err != nil {
		return nil, err
	}
	return &out.Project, nil
}

func (c *Client) GetProject(ctx context.Context, id string) (*Project, error) {
	var out ProjectBody
	if err := c.do(ctx, http.MethodGet, "projects/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Project, nil
}

func (c *Client) ListProjects(ctx context.Context) ([]Project, error) {
	var out ProjectsBody
	err := c.do(ctx, http.MethodGet, "projects", nil, nil, &out)
	return out.Projects, err
}

func (c *Client) DeleteProject(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "projects/"+esc(id), nil, nil, nil)
}

// VPCs.

func (c *Client) CreateVPC(ctx context.Context, projectID string, v VPC) (*VPC, error) {
	var out VPCBody
	if err := c.do(ctx, http.MethodPost, "project/"+esc(projectID)+"/vpcs", nil, VPCBody{v}, &out); err != nil {
		return nil, err
	}
	return &out.VPC, nil
}

func (c *Client) GetVPC(ctx context.Context, projectID, id string) (*VPC, error) {
	var out VPCBody
	if err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/vpcs/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.VPC, nil
}

func (c *Client) ListVPCs(ctx context.Context, projectID string) ([]VPC, error) {
	var out VPCsBody
	err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/vpcs", nil, nil, &out)
	return out.VPCs, err
}

func (c *Client) DeleteVPC(ctx context.Context, projectID, id string) error {
	return c.do(ctx, http.MethodDelete, "project/"+esc(projectID)+"/vpcs/"+esc(id), nil, nil, nil)
}

// Subnets.

func (c *Client) CreateSubnet(ctx context.Context, projectID string, s Subnet) (*Subnet, error) {
	var out SubnetBody
	if err := c.do(ctx, http.MethodPost, "project/"+esc(projectID)+"/subnets", nil, SubnetBody{s}, &out); err != nil {
		return nil, err
	}
	return &out.Subnet, nil
}

func (c *Client) GetSubnet(ctx context.Context, projectID, id string) (*Subnet, error) {
	var out SubnetBody
	if err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/subnets/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Subnet, nil
}

// ListSubnets lists a project's subnets, only those of VPC networkID when
// it is not empty.
func (c *Client) ListSubnets(ctx context.Context, projectID, networkID string) ([]Subnet, error) {
	var q url.Values
	if networkID != "" {
		q = url.Values{"network_id": {networkID}}
	}
	var out SubnetsBody
	err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/subnets", q, nil, &out)
	return out.Subnets, err
}

func (c *Client) DeleteSubnet(ctx context.Context, projectID, id string) error {
	return c.do(ctx, http.MethodDelete, "project/"+esc(projectID)+"/subnets/"+esc(id), nil, nil, nil)
}

// Ports.

// CreatePort creates one port; it starts PENDING.
func (c *Client) CreatePort(ctx context.Context, projectID string, p Port) (*Port, error) {
	var out PortBody
	if err := c.do(ctx, http.MethodPost, "project/"+esc(projectID)+"/ports", nil, PortBody{p}, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// CreatePortWait creates one port and, in the same request, waits as
// WaitPort does: the answer comes once the port's status is no longer
// PENDING (or equals waitStatus), or as it is after timeout. A controller
// that ignores the query answers at once with the PENDING port; the
// caller checks Status and falls back to WaitPort.
func (c *Client) CreatePortWait(ctx context.Context, projectID string, p Port, waitStatus string, timeout time.Duration) (*Port, error) {
	if waitStatus == "" {
		waitStatus = StatusUp
	}
	q := url.Values{"wait_status": {waitStatus}, "timeout": {timeout.String()}}
	var out PortBody
	if err := c.do(ctx, http.MethodPost, "project/"+esc(projectID)+"/ports", q, PortBody{p}, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// CreatePorts creates ports in bulk, all or nothing.
func (c *Client) CreatePorts(ctx context.Context, projectID string, ps []Port) ([]Port, error) {
	var out PortsBody
	if err := c.do(ctx, http.MethodPost, "project/"+esc(projectID)+"/ports", nil, PortsBody{ps}, &out); err != nil {
		return nil, err
	}
	return out.Ports, nil
}

func (c *Client) GetPort(ctx context.Context, projectID, id string) (*Port, error) {
	var out PortBody
	if err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/ports/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// WaitPort long-polls: it returns the port once its status is no longer
// PENDING (or equals waitStatus, when given), or as it is after timeout.
// The caller checks Status.
func (c *Client) WaitPort(ctx context.Context, projectID, id, waitStatus string, timeout time.Duration) (*Port, error) {
	if waitStatus == "" {
		waitStatus = StatusUp
	}
	q := url.Values{"wait_status": {waitStatus}, "timeout": {timeout.String()}}
	var out PortBody
	if err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/ports/"+esc(id), q, nil, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

func (c *Client) ListPorts(ctx context.Context, projectID string, f PortFilter) ([]Port, error) {
	q := url.Values{}
	for k, v := range map[string]string{"binding:host_id": f.HostID, "device_id": f.DeviceID, "name": f.Name, "network_id": f.NetworkID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var out PortsBody
	err := c.do(ctx, http.MethodGet, "project/"+esc(projectID)+"/ports", q, nil, &out)
	return out.Ports, err
}

// DeletePort deletes a port; an unknown port is a kerrors.NotFound error.
func (c *Client) DeletePort(ctx context.Context, projectID, id string) error {
	return c.do(ctx, http.MethodDelete, "project/"+esc(projectID)+"/ports/"+esc(id), nil, nil, nil)
}

// SetPortStatus is the agent's report: UP once plugged, DOWN or ERROR with
// a reason.
func (c *Client) SetPortStatus(ctx context.Context, projectID, id, status, reason string) (*Port, error) {
	var out PortBody
	in := PortStatusUpdate{Status: status, StatusReason: reason}
	if err := c.do(ctx, http.MethodPut, "project/"+esc(projectID)+"/ports/"+esc(id)+"/status", nil, in, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// SetPortBinding binds a port to another host, keeping its addresses and
// MAC (PortBindingUpdate).
func (c *Client) SetPortBinding(ctx context.Context, projectID, id, hostID string) (*Port, error) {
	var out PortBody
	in := PortBindingUpdate{BindingHostID: hostID}
	if err := c.do(ctx, http.MethodPut, "project/"+esc(projectID)+"/ports/"+esc(id)+"/binding", nil, in, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// Hosts.

// RegisterHost registers or refreshes a host.
func (c *Client) RegisterHost(ctx context.Context, h Host) (*Host, error) {
	var out HostBody
	if err := c.do(ctx, http.MethodPut, "hosts/"+esc(h.ID), nil, HostBody{h}, &out); err != nil {
		return nil, err
	}
	return &out.Host, nil
}

func (c *Client) GetHost(ctx context.Context, id string) (*Host, error) {
	var out HostBody
	if err := c.do(ctx, http.MethodGet, "hosts/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Host, nil
}

func (c *Client) ListHosts(ctx context.Context) ([]Host, error) {
	var out HostsBody
	err := c.do(ctx, http.MethodGet, "hosts", nil, nil, &out)
	return out.Hosts, err
}

func (c *Client) DeleteHost(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "hosts/"+esc(id), nil, nil, nil)
}

// Watches.

// WatchPorts streams port events after revision since (0: replay every
// current port as ADDED, then SYNCED, then live events), only those bound to
// hostID when it is not empty. Iteration ends when ctx is cancelled, the
// stream ends, or after an error is yielded; a compacted revision yields an
// error wrapping ErrCompacted. Usage:
//
//	for ev, err := range c.WatchPorts(ctx, rev, host) { ... }
func (c *Client) WatchPorts(ctx context.Context, since int64, hostID string) iter.Seq2[Event, error] {
	q := url.Values{"since": {strconv.FormatInt(since, 10)}}
	if hostID != "" {
		q.Set("binding:host_id", hostID)
	}
	return c.watch(ctx, "watch/ports", q)
}

// WatchHostPorts streams what a host agent needs: the ports bound to
// hostID and every port of a VPC in which hostID has a port. It always
// starts with a listing (ADDED events, then SYNCED) and cannot resume from
// a revision: after a break, call it again. When a port brings the host
// into a VPC, the event is followed by ADDED events for that VPC's other
// ports; when the host's last port in a VPC goes, events for the VPC's
// other ports stop, and the caller should forget them.
func (c *Client) WatchHostPorts(ctx context.Context, hostID string) iter.Seq2[Event, error] {
	q := url.Values{"since": {"0"}, "binding:host_id": {hostID}, "vpc_peers": {"true"}}
	return c.watch(ctx, "watch/ports", q)
}

// WatchHosts is WatchPorts for hosts.
func (c *Client) WatchHosts(ctx context.Context, since int64) iter.Seq2[Event, error] {
	return c.watch(ctx, "watch/hosts", url.Values{"since": {strconv.FormatInt(since, 10)}})
}

func (c *Client) watch(ctx context.Context, path string, q url.Values) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		req, err := c.newRequest(ctx, http.MethodGet, path, q, nil)
		if err != nil {
			yield(Event{}, err)
			return
		}
		req.Header.Set("Accept", "application/x-ndjson")
		resp, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				err = kerrors.New(kerrors.Unavailable, "%v", err)
			}
			yield(Event{}, fmt.Errorf("GET %s: %w", path, err))
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			yield(Event{}, decodeError(http.MethodGet, path, resp))
			return
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue // keep-alive
			}
			var ev struct {
				Event
				Error *ErrorDetail `json:"error"`
			}
			if err := json.Unmarshal(line, &ev); err != nil {
				yield(Event{}, fmt.Errorf("GET %s: decode event: %w", path, err))
				return
			}
			if ev.Type == "ERROR" {
				var err error = kerrors.New(kerrors.Unavailable, "watch ended by server")
				if ev.Error != nil {
					if ev.Error.Type == "Gone" {
						err = fmt.Errorf("%s: %w", ev.Error.Message, ErrCompacted)
					} else {
						err = kerrors.FromType(ev.Error.Type, ev.Error.Message)
					}
				}
				yield(Event{}, fmt.Errorf("GET %s: %w", path, err))
				return
			}
			if !yield(ev.Event, nil) {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		err = sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		yield(Event{}, fmt.Errorf("GET %s: stream ended: %w", path, kerrors.New(kerrors.Unavailable, "%v", err)))
	}
}
