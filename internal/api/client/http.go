package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

// The HTTP/1.1 this client speaks: one request per connection (a CLI
// command makes one or two), a JSON body with Content-Length, and a
// response with a Content-Length body, a chunked one (with trailers), one
// that ends with the connection, or 101 Switching Protocols, after which
// the connection carries the frame protocol.

// maxHeaderBytes bounds a response's status line and headers (and a
// chunked body's trailers).
const maxHeaderBytes = 64 << 10

// response is an HTTP response read from the daemon.
type response struct {
	code    int
	status  string // "404 Not Found"
	header  textproto.MIMEHeader
	body    io.Reader
	trailer textproto.MIMEHeader // set once a chunked body reached its end
}

// exchange is one request on its own connection.
type exchange struct {
	conn net.Conn
	br   *bufio.Reader
	stop func() bool // releases the context watch
	once sync.Once
}

// Close ends the exchange and its connection.
func (x *exchange) Close() error {
	var err error
	x.once.Do(func() {
		x.stop()
		err = x.conn.Close()
	})
	return err
}

// Read and Write serve an upgraded connection: reads drain what the
// response reader buffered first.
func (x *exchange) Read(p []byte) (int, error)  { return x.br.Read(p) }
func (x *exchange) Write(p []byte) (int, error) { return x.conn.Write(p) }

// roundTrip sends a request and reads the response head. The caller must
// Close the exchange. A context that ends closes the connection.
func (c *Client) roundTrip(ctx context.Context, method, target string, body []byte, upgrade bool) (*exchange, *response, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", method, target, ctx.Err())
		}
		return nil, nil, kerrors.New(kerrors.Unavailable, "cannot reach kurmad at %s: %v", c.socket, err)
	}
	lr := &limitedLines{r: conn, left: maxHeaderBytes}
	x := &exchange{conn: conn, br: bufio.NewReader(lr)}
	x.stop = context.AfterFunc(ctx, func() { _ = conn.Close() })
	fail := func(err error) (*exchange, *response, error) {
		x.Close()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", method, target, ctx.Err())
		}
		return nil, nil, kerrors.New(kerrors.Unavailable, "%s %s: kurmad at %s: %v", method, target, c.socket, err)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: kurma\r\nUser-Agent: kurma\r\n", method, target)
	if upgrade {
		req.WriteString("Connection: Upgrade\r\nUpgrade: " + upgradeProtocol + "\r\n")
	} else {
		req.WriteString("Connection: close\r\n")
	}
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return fail(fmt.Errorf("send request: %w", err))
	}
	resp, err := readResponse(x.br, lr, method)
	if err != nil {
		return fail(err)
	}
	if resp.code == 101 {
		resp.body = x
	}
	return x, resp, nil
}

// readResponse reads a response's head from br, whose reads lr bounds to
// maxHeaderBytes until the head is read, and sets up its body reader (not
// for 101, whose body is the connection: what br buffered, then the rest).
func readResponse(br *bufio.Reader, lr *limitedLines, method string) (*response, error) {
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err != nil {
		return nil, fmt.Errorf("read status line: %w", err)
	}
	proto, rest, ok := strings.Cut(line, " ")
	if !ok || !strings.HasPrefix(proto, "HTTP/1.") {
		return nil, fmt.Errorf("malformed status line %q", line)
	}
	codeStr, _, _ := strings.Cut(rest, " ")
	code, err := strconv.Atoi(codeStr)
	if err != nil || len(codeStr) != 3 || code < 100 {
		return nil, fmt.Errorf("malformed status line %q", line)
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, fmt.Errorf("read headers: %w", err)
	}
	lr.left = -1 // the body is not bounded here
	resp := &response{code: code, status: strings.TrimSpace(rest), header: hdr}
	switch {
	case code == 101:
	case code == 204 || code == 304 || code < 200 || method == "HEAD":
		resp.body = strings.NewReader("")
	case strings.EqualFold(hdr.Get("Transfer-Encoding"), "chunked"):
		resp.body = &chunked{r: br, resp: resp}
	case hdr.Get("Content-Length") != "":
		n, err := strconv.ParseInt(hdr.Get("Content-Length"), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad Content-Length %q", hdr.Get("Content-Length"))
		}
		resp.body = io.LimitReader(br, n)
	default:
		resp.body = br // until the daemon closes the connection
	}
	return resp, nil
}

// limitedLines passes reads through while left >= 0 bounds them (the head
// of a response); left < 0 means no bound.
type limitedLines struct {
	r    io.Reader
	left int
}

func (l *limitedLines) Read(p []byte) (int, error) {
	if l.left == 0 {
		return 0, errors.New("response head too large")
	}
	if l.left > 0 && len(p) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	if l.left > 0 {
		l.left -= n
	}
	return n, err
}

// chunked decodes a chunked body; at its end it reads the trailers into
// resp.trailer.
type chunked struct {
	r    *bufio.Reader
	resp *response
	left int64 // of the current chunk
	done bool
	err  error
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		line, err := readLine(c.r)
		if err != nil {
			c.err = fmt.Errorf("read chunk size: %w", err)
			return 0, c.err
		}
		sz, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(sz), 16, 64)
		if err != nil || n < 0 {
			c.err = fmt.Errorf("bad chunk size %q", line)
			return 0, c.err
		}
		if n == 0 {
			tr, err := readTrailers(c.r)
			if err != nil && !errors.Is(err, io.EOF) {
				c.err = fmt.Errorf("read trailers: %w", err)
				return 0, c.err
			}
			c.resp.trailer = tr
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		c.err = err
		return n, err
	}
	if c.left == 0 {
		if line, err := readLine(c.r); err != nil || line != "" {
			c.err = errors.New("chunk not followed by CRLF")
			return n, nil
		}
	}
	return n, nil
}

// readLine reads a CRLF- or LF-terminated line of at most 4 KiB.
func readLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		frag, more, err := r.ReadLine()
		if err != nil {
			return "", err
		}
		b = append(b, frag...)
		if len(b) > 4096 {
			return "", errors.New("line too long")
		}
		if !more {
			return string(b), nil
		}
	}
}

// readTrailers reads the trailer lines after a chunked body's last chunk,
// at most maxHeaderBytes of them, up to the blank line.
func readTrailers(r *bufio.Reader) (textproto.MIMEHeader, error) {
	tr := textproto.MIMEHeader{}
	total := 0
	for {
		line, err := readLine(r)
		if err != nil {
			return tr, err
		}
		if line == "" {
			return tr, nil
		}
		if total += len(line); total > maxHeaderBytes {
			return tr, errors.New("trailers too large")
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return tr, fmt.Errorf("malformed trailer %q", line)
		}
		tr.Add(textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(k)), strings.TrimSpace(v))
	}
}
