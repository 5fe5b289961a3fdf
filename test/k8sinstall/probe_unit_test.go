package k8sinstall

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestProbeOnce: probeOnce's verdicts on loopback (the test's own
// namespace): an answer, a refusal, a server that never answers, a
// server that closes without answering.
func TestProbeOnce(t *testing.T) {
	here := func(f func() error) error { return f() }
	serve := func(t *testing.T, h func(net.Conn)) netip.AddrPort {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); h(c) }()
			}
		}()
		return netip.MustParseAddrPort(ln.Addr().String())
	}
	closed := func(t *testing.T) netip.AddrPort {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := netip.MustParseAddrPort(ln.Addr().String())
		_ = ln.Close()
		return a
	}
	for _, tc := range []struct {
		name    string
		addr    func(t *testing.T) netip.AddrPort
		answer  string
		wantErr error
	}{
		{"answers", func(t *testing.T) netip.AddrPort {
			return serve(t, func(c net.Conn) {
				if l, err := bufio.NewReader(c).ReadString('\n'); err == nil && l == "hostname\n" {
					_, _ = c.Write([]byte("echo-1\n"))
				}
			})
		}, "echo-1", nil},
		{"refused", closed, "", syscall.ECONNREFUSED},
		{"never answers", func(t *testing.T) netip.AddrPort {
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) })
			return serve(t, func(net.Conn) { <-stop })
		}, "", os.ErrDeadlineExceeded},
		{"closes", func(t *testing.T) netip.AddrPort {
			return serve(t, func(c net.Conn) { _, _ = bufio.NewReader(c).ReadString('\n') })
		}, "", io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := probeOnce(here, tc.addr(t), "hostname", 250*time.Millisecond, 250*time.Millisecond)
			if tc.wantErr == nil && a.err != nil || tc.wantErr != nil && !errors.Is(a.err, tc.wantErr) {
				t.Fatalf("err %v, want %v", a.err, tc.wantErr)
			}
			if a.answer != tc.answer || (a.err == nil) == a.answered.IsZero() {
				t.Fatalf("answer %q at %v, want %q", a.answer, a.answered, tc.answer)
			}
			if a.err == nil && (a.connected.Before(a.start) || a.answered.Before(a.connected.Add(-10*time.Millisecond)) || time.Since(a.answered) > time.Second) {
				t.Fatalf("started %v, connected %v, answered %v", a.start, a.connected, a.answered)
			}
		})
	}
}
