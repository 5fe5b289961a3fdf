package k8sinstall

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
)

// here runs f in the test's own namespace (probeOnce's "in" argument).
func here(f func() error) error { return f() }

// serve answers each connection to a loopback listener with h, until the
// test ends, and returns the listener's address.
func serve(t *testing.T, h func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, h)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// TestProbeOnce: probeOnce's verdicts on loopback (the test's own
// namespace): an answer, a refusal, a server that never answers, a
// server that closes without answering.
func TestProbeOnce(t *testing.T) {
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

// TestProbeOnceLateClient: a prober stopped (SIGSTOP) for longer than its
// deadlines, while the path and the server answer at once, counts every
// attempt answered and reports itself late: the verdict is the kernel's,
// not the client's clock.
func TestProbeOnceLateClient(t *testing.T) {
	if addr := os.Getenv("K8SINSTALL_PROBE_HELPER"); addr != "" {
		// The stopped prober: one attempt after another, one line each.
		ap := netip.MustParseAddrPort(addr)
		for range 30 {
			a := probeOnce(here, ap, "hostname", 250*time.Millisecond, 250*time.Millisecond)
			fmt.Printf("attempt %q %v %d\n", a.answer, a.err, a.late.Milliseconds())
		}
		return
	}
	ap := serve(t, func(c net.Conn) {
		if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			// Slow enough that most stops fall while the prober waits
			// for the answer.
			time.Sleep(100 * time.Millisecond)
			_, _ = c.Write([]byte("echo-1\n"))
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^TestProbeOnceLateClient$")
	cmd.Env = append(os.Environ(), "K8SINSTALL_PROBE_HELPER="+ap.String())
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	t.Cleanup(func() { _ = pr.Close() })
	// The prober's lines (out is read once read is closed); the stops
	// begin once it probes, not while it starts.
	var (
		out      bytes.Buffer
		attempts = make(chan struct{}, 64) // one per attempt line
		read     = make(chan struct{})
	)
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "attempt ") {
				attempts <- struct{}{}
			}
		}
	}()
	done := make(chan error, 1)
	go func() { <-read; done <- cmd.Wait() }()
	// Every third attempt done, the next is stopped 50 ms in (waiting for
	// the answer, which comes 100 ms in) for 400 ms: longer than both
	// deadlines.
	for stops, n := 0, 0; ; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("prober: %v\n%s", err, out.String())
			}
			late, n := 0, 0
			for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				rest, ok := strings.CutPrefix(l, "attempt ")
				if !ok {
					continue // the test framework's own lines
				}
				n++
				f := strings.Fields(rest)
				if len(f) < 3 || f[0] != `"echo-1"` || f[1] != "<nil>" {
					t.Fatalf("an attempt failed while the prober was stopped: %q\n%s", l, out.String())
				}
				if f[len(f)-1] != "0" {
					late++
				}
			}
			if n != 30 || late == 0 {
				t.Fatalf("%d attempts, %d late (%d stops): the test proved nothing\n%s", n, late, stops, out.String())
			}
			t.Logf("%d attempts answered, %d of them looked at late (%d stops of 400 ms)", n, late, stops)
			return
		case <-attempts:
			if n++; n%3 == 0 && stops < 6 {
				time.Sleep(50 * time.Millisecond)
				_ = cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(400 * time.Millisecond)
				_ = cmd.Process.Signal(syscall.SIGCONT)
				stops++
			}
		}
	}
}
