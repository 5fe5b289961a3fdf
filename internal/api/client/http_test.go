package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/kerrors"
)

func parse(raw string) (*response, string, error) {
	lr := &limitedLines{r: strings.NewReader(raw), left: maxHeaderBytes}
	resp, err := readResponse(bufio.NewReader(lr), lr, "GET")
	if err != nil {
		return nil, "", err
	}
	if resp.body == nil {
		return resp, "", nil
	}
	b, err := io.ReadAll(resp.body)
	return resp, string(b), err
}

// TestReadResponse covers the responses kurmad's net/http server sends
// and malformed ones.
func TestReadResponse(t *testing.T) {
	big := "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", maxHeaderBytes) + "\r\n\r\n"
	for _, tc := range []struct {
		name, raw, body, trailer string
		code                     int
		wantErr                  string
	}{
		{name: "content-length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", code: 200, body: "hello"},
		{name: "no length reads to the end", raw: "HTTP/1.1 200 OK\r\n\r\nall of it", code: 200, body: "all of it"},
		{name: "chunked with trailer", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Kurma-Error\r\n\r\n3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nKurma-Error: {\"error\":{}}\r\n\r\n",
			code: 200, body: "abcdefg", trailer: `{"error":{}}`},
		{name: "error status", raw: "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}", code: 404, body: "{}"},
		{name: "no content", raw: "HTTP/1.1 204 No Content\r\n\r\n", code: 204},
		{name: "bad status line", raw: "SSH-2.0-x\r\n\r\n", wantErr: "malformed status line"},
		{name: "bad code", raw: "HTTP/1.1 2x0 OK\r\n\r\n", wantErr: "malformed status line"},
		{name: "bad length", raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", wantErr: "Content-Length"},
		{name: "bad chunk size", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", code: 200, wantErr: "chunk size"},
		{name: "truncated chunk", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc", code: 200, wantErr: "unexpected EOF"},
		{name: "head too large", raw: big, wantErr: "too large"},
		{name: "truncated head", raw: "HTTP/1.1 200 OK\r\nContent-Le", wantErr: "headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body, err := parse(tc.raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.code != tc.code || body != tc.body {
				t.Errorf("got %d %q, want %d %q", resp.code, body, tc.code, tc.body)
			}
			if got := resp.trailer.Get("Kurma-Error"); got != tc.trailer {
				t.Errorf("trailer %q, want %q", got, tc.trailer)
			}
		})
	}
}

// TestUpgradeKeepsBufferedFrames: bytes the daemon sends right after its
// 101 head, which the head's reader may have buffered, reach the stream.
func TestUpgradeKeepsBufferedFrames(t *testing.T) {
	sock, ln := listen(t)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = bufio.NewReader(c).ReadString('\n')
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: kurma-stream\r\nConnection: Upgrade\r\n\r\nframes follow")
	}()
	x, resp, err := New(sock).roundTrip(t.Context(), "POST", "/v1/pods", []byte("{}"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	b, _ := io.ReadAll(x)
	if resp.code != 101 || string(b) != "frames follow" {
		t.Fatalf("got %d %q", resp.code, b)
	}
}

// TestContextAndAbsentDaemon: a daemon that never answers is left when
// the context ends; one that is not there is Unavailable, naming the
// socket.
func TestContextAndAbsentDaemon(t *testing.T) {
	sock, ln := listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := New(sock).Version(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("silent daemon: %v after %v", err, time.Since(start))
	}
	_, err = New(sock + ".none").Version(t.Context())
	if !errors.Is(err, kerrors.Unavailable) || !strings.Contains(err.Error(), sock+".none") {
		t.Errorf("absent daemon: %v", err)
	}
}

// FuzzReadResponse: whatever the socket sends, reading a response and its
// body must not panic or read without bound.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nKurma-Error: x\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\n\r\n\x03\x00\x00\x00\x02{}"))
	f.Add([]byte("HTTP/1.0 500 x\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp, body, err := parse(string(raw))
		if err != nil {
			return
		}
		if resp.code < 100 || resp.code > 999 || len(body) > len(raw) {
			t.Fatalf("code %d, body of %d bytes from %d", resp.code, len(body), len(raw))
		}
	})
}

// listen makes a unix socket listener for a stand-in daemon.
func listen(t *testing.T) (string, net.Listener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "k.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return sock, ln
}
