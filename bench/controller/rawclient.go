package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// poster is the load generator of the single-create run: one kept-alive
// HTTP/1.1 connection that sends a POST with a JSON body and reads the
// whole response, as wrk or JMeter do. It exists because the client shares
// the two cores with the server: net/http's client costs three goroutines
// and two channel hand-offs per request (a quarter of all CPU in an
// in-process profile), which this does without. The server sees the same
// requests as from pkg/controllerapi: same method, path, headers that
// matter and body.
type poster struct {
	conn net.Conn
	br   *bufio.Reader
	req  []byte // request line and headers, Content-Length last
	buf  []byte // response body
}

func dialPoster(ctx context.Context, base, path string) (*poster, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	req := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kurma-bench\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: ", path, u.Host)
	return &poster{conn: conn, br: bufio.NewReaderSize(conn, 16<<10), req: req}, nil
}

func (p *poster) Close() error { return p.conn.Close() }

// post sends body and reads the response. Anything but want, or a body that
// does not start with prefix, is an error.
func (p *poster) post(body []byte, want int, prefix []byte) error {
	msg := strconv.AppendInt(p.req, int64(len(body)), 10)
	msg = append(msg, "\r\n\r\n"...)
	msg = append(msg, body...)
	if _, err := p.conn.Write(msg); err != nil {
		return err
	}
	p.req = msg[:len(p.req)] // keep the grown buffer
	status, n, err := p.readHead()
	if err != nil {
		return err
	}
	if cap(p.buf) < n {
		p.buf = make([]byte, n)
	}
	p.buf = p.buf[:n]
	if _, err := io.ReadFull(p.br, p.buf); err != nil {
		return fmt.Errorf("read response body: %w", err)
	}
	if status != want {
		return fmt.Errorf("status %d: %s", status, p.buf)
	}
	if !bytes.HasPrefix(p.buf, prefix) {
		return fmt.Errorf("unexpected response body %.200q", p.buf)
	}
	return nil
}

// readHead reads the status line and headers and returns the status code
// and Content-Length (the server sends one for single-port answers).
func (p *poster) readHead() (status, length int, err error) {
	line, err := p.br.ReadSlice('\n')
	if err != nil {
		return 0, 0, fmt.Errorf("read status line: %w", err)
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, 0, fmt.Errorf("bad status line %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, 0, fmt.Errorf("bad status line %q", line)
	}
	length = -1
	for {
		line, err := p.br.ReadSlice('\n')
		if err != nil {
			return 0, 0, fmt.Errorf("read header: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, 0, fmt.Errorf("bad header %q", line)
		}
		switch {
		case bytes.EqualFold(k, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return 0, 0, fmt.Errorf("bad Content-Length %q", v)
			}
		case bytes.EqualFold(k, []byte("Transfer-Encoding")):
			return 0, 0, fmt.Errorf("chunked responses are not read by this client")
		}
	}
	if length < 0 {
		return 0, 0, fmt.Errorf("response without Content-Length")
	}
	return status, length, nil
}

// postParallel sends n requests with body over conc connections and returns
// the elapsed time from the first request to the last answer (connections
// are opened before the clock starts).
func postParallel(ctx context.Context, base, path string, n, conc int, body []byte, want int, prefix []byte) (time.Duration, error) {
	posters := make([]*poster, conc)
	for i := range posters {
		p, err := dialPoster(ctx, base, path)
		if err != nil {
			return 0, err
		}
		defer p.Close()
		posters[i] = p
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for _, p := range posters {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := p.post(body, want, prefix); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}
