package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

// The plugin's own client for the few controller calls it makes. It does
// not use pkg/controllerapi, whose client is built on net/http: that
// package's initialisation, its connection goroutines and the larger
// binary were a large share of the short-lived plugin's process time
// (figures in bench/cni/README.md). The wire types below carry only the fields the
// plugin sends or reads; their JSON names are those of pkg/controllerapi
// (a test compares the two encodings).

// Port statuses (pkg/controllerapi).
const (
	statusPending = "PENDING"
	statusUp      = "UP"
	statusError   = "ERROR"
)

// port is the plugin's view of a controller port.
type port struct {
	ID                  string    `json:"id,omitempty"`
	ProjectID           string    `json:"project_id,omitempty"`
	Name                string    `json:"name,omitempty"`
	Description         string    `json:"description,omitempty"`
	NetworkID           string    `json:"network_id,omitempty"`
	DeviceID            string    `json:"device_id,omitempty"`
	VethName            string    `json:"veth_name,omitempty"`
	NetworkNS           string    `json:"network_ns,omitempty"`
	AdminStateUp        *bool     `json:"admin_state_up,omitempty"`
	PortSecurityEnabled *bool     `json:"port_security_enabled,omitempty"`
	BindingHostID       string    `json:"binding:host_id,omitempty"`
	BindingVNICType     string    `json:"binding:vnic_type,omitempty"`
	FastPath            *bool     `json:"fast_path,omitempty"`
	Status              string    `json:"status,omitempty"`
	StatusReason        string    `json:"status_reason,omitempty"`
	MACAddress          string    `json:"mac_address,omitempty"`
	FixedIPs            []fixedIP `json:"fixed_ips,omitempty"`
}

type fixedIP struct {
	SubnetID  string `json:"subnet_id,omitempty"`
	IPAddress string `json:"ip_address,omitempty"`
	CIDR      string `json:"cidr,omitempty"`
	GatewayIP string `json:"gateway_ip,omitempty"`
}

type subnet struct {
	ID             string   `json:"id,omitempty"`
	CIDR           string   `json:"cidr,omitempty"`
	GatewayIP      string   `json:"gateway_ip,omitempty"`
	DNSNameservers []string `json:"dns_nameservers,omitempty"`
}

// portFilter selects ports in ListPorts; empty fields match everything.
type portFilter struct {
	HostID, DeviceID, NetworkID string
}

// maxBody bounds a response body (a port list of a busy host fits well).
const maxBody = 16 << 20

// apiClient sends HTTP/1.1 requests to one controller. Safe for concurrent
// use: a request takes an idle connection or dials a new one, and gives it
// back when the response was read in full and the server keeps it open.
type apiClient struct {
	base    *url.URL // http or https, no trailing slash in Path
	token   string
	dialTO  time.Duration
	tlsConf *tls.Config // nil for http
	trace   *tracer

	mu   sync.Mutex // guards idle
	idle []*apiConn
}

type apiConn struct {
	c  net.Conn
	br *bufio.Reader
}

func newAPIClient(base *url.URL, token string, dialTimeout time.Duration, tr *tracer) *apiClient {
	b := *base
	b.Path = strings.TrimRight(b.Path, "/")
	b.RawPath = ""
	c := &apiClient{base: &b, token: token, dialTO: dialTimeout, trace: tr}
	if b.Scheme == "https" {
		c.tlsConf = &tls.Config{ServerName: b.Hostname(), MinVersion: tls.VersionTLS12}
	}
	return c
}

func (c *apiClient) hostPort() string {
	if c.base.Port() != "" {
		return c.base.Host
	}
	if c.tlsConf != nil {
		return net.JoinHostPort(c.base.Hostname(), "443")
	}
	return net.JoinHostPort(c.base.Hostname(), "80")
}

// conn returns an idle connection (reused true) or dials one.
func (c *apiClient) conn(ctx context.Context) (*apiConn, bool, error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 {
		ac := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return ac, true, nil
	}
	c.mu.Unlock()
	d := net.Dialer{Timeout: c.dialTO, KeepAlive: -1}
	nc, err := d.DialContext(ctx, "tcp", c.hostPort())
	if err != nil {
		return nil, false, err
	}
	if c.tlsConf != nil {
		tc := tls.Client(nc, c.tlsConf)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, false, err
		}
		nc = tc
	}
	return &apiConn{c: nc, br: bufio.NewReaderSize(nc, 8<<10)}, false, nil
}

func (c *apiClient) release(ac *apiConn, reuse bool) {
	if !reuse {
		_ = ac.c.Close()
		return
	}
	c.mu.Lock()
	c.idle = append(c.idle, ac)
	c.mu.Unlock()
}

// do sends one request and decodes a 2xx JSON answer into out (if not
// nil). label names the request in the trace.
func (c *apiClient) do(ctx context.Context, label, method, path string, q url.Values, in, out any) error {
	what := method + " " + path
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("encode %s: %w", what, err)
		}
	}
	done := c.trace.begin(label)
	defer done()
	resp, err := c.exchange(ctx, method, path, q, body, true)
	if err != nil {
		return c.netError(ctx, what, err)
	}
	if resp.status < 200 || resp.status > 299 {
		return fmt.Errorf("%s: %w", what, &httpStatusError{resp.status, httpError(resp.status, resp.body)})
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(resp.body, out); err != nil {
		return fmt.Errorf("%s: decode response: %w", what, err)
	}
	return nil
}

// exchange writes the request and reads the answer. A request that fails
// on a reused connection before any answer arrives (the server closed it
// while idle) is sent again once on a new one, unless it is a POST.
func (c *apiClient) exchange(ctx context.Context, method, path string, q url.Values, body []byte, retry bool) (*response, error) {
	ac, reused, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	// The context bounds the whole exchange: its deadline becomes the
	// connection's, and a cancellation interrupts blocked I/O.
	if dl, ok := ctx.Deadline(); ok {
		_ = ac.c.SetDeadline(dl)
	} else {
		_ = ac.c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = ac.c.SetDeadline(time.Now()) })
	defer stop()

	target := c.base.EscapedPath() + "/" + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\nUser-Agent: mizarmp\r\n", method, target, c.base.Host)
	if c.token != "" {
		fmt.Fprintf(&req, "Authorization: Bearer %s\r\n", c.token)
	}
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	_, err = ac.c.Write(req.Bytes())
	var resp *response
	if err == nil {
		resp, err = readResponse(ac.br)
	}
	if err != nil {
		c.release(ac, false)
		if reused && retry && method != "POST" && closedByPeer(err) && !ctxEnded(ctx) && ac.br.Buffered() == 0 {
			return c.exchange(ctx, method, path, q, body, false)
		}
		return nil, err
	}
	c.release(ac, resp.keepAlive && stop())
	return resp, nil
}

// closedByPeer reports whether err says the server closed the connection.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ctxEnded reports whether ctx is done or its deadline has passed (the
// connection's deadline, set from it, can fire before the context's own
// timer does).
func ctxEnded(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

// netError wraps a transport failure: the context's error when it ended
// the request (a timeout maps to CNI code 11), else Unavailable.
func (c *apiClient) netError(ctx context.Context, what string, err error) error {
	if ctxEnded(ctx) {
		cerr := ctx.Err()
		if cerr == nil {
			cerr = context.DeadlineExceeded
		}
		return fmt.Errorf("%s: %v: %w", what, err, cerr)
	}
	return fmt.Errorf("%s: %w", what, kerrors.New(kerrors.Unavailable, "%v", err))
}

// httpStatusError is a non-2xx answer: the status code and the categorised
// error httpError made of it (which already names the status when the
// controller sent no error body).
type httpStatusError struct {
	status int
	err    error
}

func (e *httpStatusError) Error() string { return e.err.Error() }
func (e *httpStatusError) Unwrap() error { return e.err }

// httpError turns a non-2xx answer into a categorised error: the
// controller's {"error":{"type","message"}} when present, else by status.
func httpError(status int, body []byte) error {
	var eb struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error.Message != "" {
		return kerrors.FromType(eb.Error.Type, eb.Error.Message)
	}
	text := string(bytes.TrimSpace(body[:min(len(body), 512)]))
	cat := map[int]error{
		404: kerrors.NotFound, 409: kerrors.Conflict, 400: kerrors.Invalid,
		401: kerrors.Unauthorized, 403: kerrors.Unauthorized,
		502: kerrors.Unavailable, 503: kerrors.Unavailable, 504: kerrors.Timeout,
	}[status]
	if cat == nil {
		return fmt.Errorf("HTTP %d: %s", status, text)
	}
	return fmt.Errorf("HTTP %d: %w", status, kerrors.New(cat, "%s", text))
}

// response is a read HTTP/1.1 response.
type response struct {
	status    int
	body      []byte
	keepAlive bool
}

// readResponse reads one HTTP/1.1 response (status line, headers, and a
// Content-Length, chunked or read-until-close body of at most maxBody
// bytes) from br.
func readResponse(br *bufio.Reader) (*response, error) {
	line, err := readLine(br)
	if err != nil {
		return nil, fmt.Errorf("read status line: %w", err)
	}
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") || len(code) != 3 {
		return nil, fmt.Errorf("malformed status line %q", trunc(line))
	}
	status, err := strconv.Atoi(code)
	if err != nil || status < 100 {
		return nil, fmt.Errorf("malformed status line %q", trunc(line))
	}
	r := &response{status: status, keepAlive: proto != "HTTP/1.0"}
	length, chunked := int64(-1), false
	for n := 0; ; n++ {
		h, err := readLine(br)
		if err != nil {
			return nil, fmt.Errorf("read headers: %w", err)
		}
		if h == "" {
			break
		}
		if n > 100 {
			return nil, errors.New("too many response headers")
		}
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("malformed header %q", trunc(h))
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "content-length":
			l, err := strconv.ParseInt(v, 10, 64)
			if err != nil || l < 0 {
				return nil, fmt.Errorf("bad Content-Length %q", trunc(v))
			}
			length = l
		case "transfer-encoding":
			chunked = strings.EqualFold(v, "chunked")
			if !chunked && !strings.EqualFold(v, "identity") {
				return nil, fmt.Errorf("unsupported Transfer-Encoding %q", trunc(v))
			}
		case "connection":
			if strings.EqualFold(v, "close") {
				r.keepAlive = false
			}
		}
	}
	switch {
	case status == 204 || status == 304 || status < 200:
		return r, nil
	case chunked:
		r.body, err = readChunked(br)
	case length > maxBody:
		return nil, fmt.Errorf("response body of %d bytes exceeds %d", length, maxBody)
	case length >= 0:
		r.body = make([]byte, length)
		_, err = io.ReadFull(br, r.body)
	default:
		r.keepAlive = false
		r.body, err = io.ReadAll(io.LimitReader(br, maxBody+1))
		if err == nil && len(r.body) > maxBody {
			err = fmt.Errorf("response body exceeds %d bytes", maxBody)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return r, nil
}

// readChunked reads a chunked body and its trailer.
func readChunked(br *bufio.Reader) ([]byte, error) {
	var out []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, err
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad chunk size %q", trunc(line))
		}
		if n == 0 {
			for { // trailer
				t, err := readLine(br)
				if err != nil {
					return nil, err
				}
				if t == "" {
					return out, nil
				}
			}
		}
		if int64(len(out))+n > maxBody {
			return nil, fmt.Errorf("chunked body exceeds %d bytes", maxBody)
		}
		start := len(out)
		out = append(out, make([]byte, n)...)
		if _, err := io.ReadFull(br, out[start:]); err != nil {
			return nil, err
		}
		if crlf, err := readLine(br); err != nil || crlf != "" {
			return nil, errors.New("chunk not followed by CRLF")
		}
	}
}

// readLine reads one CRLF- (or LF-) terminated line of at most 8 KiB.
func readLine(br *bufio.Reader) (string, error) {
	b, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return "", errors.New("line too long")
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func pesc(s string) string { return url.PathEscape(s) }

// The controller calls (docs/controller-api.md).

func (c *apiClient) CreatePortWait(ctx context.Context, project string, p port, waitStatus string, timeout time.Duration) (*port, error) {
	var out struct {
		Port port `json:"port"`
	}
	q := url.Values{"wait_status": {waitStatus}, "timeout": {timeout.String()}}
	in := struct {
		Port port `json:"port"`
	}{p}
	if err := c.do(ctx, "POST+WAIT", "POST", "project/"+pesc(project)+"/ports", q, in, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

func (c *apiClient) GetPort(ctx context.Context, project, id string) (*port, error) {
	var out struct {
		Port port `json:"port"`
	}
	if err := c.do(ctx, "GET", "GET", "project/"+pesc(project)+"/ports/"+pesc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

// WaitPort long-polls GET on the port until it leaves PENDING (or has
// waitStatus), or until timeout; the caller checks Status.
func (c *apiClient) WaitPort(ctx context.Context, project, id, waitStatus string, timeout time.Duration) (*port, error) {
	var out struct {
		Port port `json:"port"`
	}
	q := url.Values{"wait_status": {waitStatus}, "timeout": {timeout.String()}}
	if err := c.do(ctx, "GET+WAIT", "GET", "project/"+pesc(project)+"/ports/"+pesc(id), q, nil, &out); err != nil {
		return nil, err
	}
	return &out.Port, nil
}

func (c *apiClient) GetSubnet(ctx context.Context, project, id string) (*subnet, error) {
	var out struct {
		Subnet subnet `json:"subnet"`
	}
	if err := c.do(ctx, "GET", "GET", "project/"+pesc(project)+"/subnets/"+pesc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.Subnet, nil
}

// DeletePort deletes a port; an unknown port is a kerrors.NotFound error.
func (c *apiClient) DeletePort(ctx context.Context, project, id string) error {
	return c.do(ctx, "DELETE", "DELETE", "project/"+pesc(project)+"/ports/"+pesc(id), nil, nil, nil)
}

func (c *apiClient) ListPorts(ctx context.Context, project string, f portFilter) ([]port, error) {
	q := url.Values{}
	for k, v := range map[string]string{"binding:host_id": f.HostID, "device_id": f.DeviceID, "network_id": f.NetworkID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var out struct {
		Ports []port `json:"ports"`
	}
	err := c.do(ctx, "LIST", "GET", "project/"+pesc(project)+"/ports", q, nil, &out)
	return out.Ports, err
}
