// Package nettest holds helpers for the agent's root tests: named network
// namespaces that remove themselves, veth links between them, and TCP
// probes run inside a namespace. Only _test.go files may import it; it
// imports nothing of Kurma but testutil.
//
// Locking: none; every helper is safe to call from parallel tests.
package nettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"kurma.dev/kurma/internal/testutil"
)

// NetNSDir is where `ip netns` keeps named namespaces.
const NetNSDir = testutil.NetNSDir

// NewNS is testutil.NewNamedNetNS (the one home of the netns helpers).
func NewNS(t testing.TB, name string) string {
	t.Helper()
	return testutil.NewNamedNetNS(t, name)
}

// DelNS is testutil.DelNamedNetNS.
func DelNS(name string) { testutil.DelNamedNetNS(name) }

// Name returns the name of a namespace path under /run/netns.
func Name(path string) string { return filepath.Base(path) }

// IP runs `ip -n <ns> args...` and fails the test on error.
func IP(t testing.TB, nsPath string, args ...string) string {
	t.Helper()
	return testutil.Run(t, "ip", append([]string{"-n", Name(nsPath)}, args...)...)
}

// Serve listens on addr (e.g. "10.0.0.5:8080") inside the namespace and
// answers every connection with reply. It stops when the test ends.
func Serve(t testing.TB, nsPath, addr, reply string) {
	t.Helper()
	var ln net.Listener
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, nsPath, err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) { _, _ = io.WriteString(c, reply) })
}

// Dial connects from inside the namespace to addr and returns what the
// server sent, within timeout.
func Dial(nsPath, addr string, timeout time.Duration) (string, error) {
	return DialFrom(nsPath, "", addr, timeout)
}

// DialFrom is Dial with source address src ("" : the kernel's choice).
func DialFrom(nsPath, src, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		d := net.Dialer{Timeout: timeout}
		if src != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		}
		var err error
		c, err = d.Dial("tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	return string(b), err
}

// Reach retries Dial until it returns want or ctx ends.
func Reach(ctx context.Context, nsPath, addr, want string) error {
	var last error
	for {
		got, err := Dial(nsPath, addr, 500*time.Millisecond)
		if err == nil && got == want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("got %q, want %q", got, want)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s cannot reach %s: %w", nsPath, addr, errors.Join(last, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Links lists the link names in a namespace.
func Links(t testing.TB, nsPath string) []string {
	t.Helper()
	// Only stdout: ip warns on stderr (e.g. "Error: Peer netns reference
	// is invalid.") when a veth's peer namespace is being torn down.
	b, err := exec.Command("ip", "-n", Name(nsPath), "-o", "link", "show").Output()
	if err != nil {
		t.Fatalf("ip -n %s link show: %v", Name(nsPath), err)
	}
	out := string(b)
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		names = append(names, n)
	}
	return names
}

func runQuiet(name string, args ...string) error {
	return exec.Command(name, args...).Run()
}

// Handle returns a netlink handle inside the namespace at nsPath, closed
// when the test ends.
func Handle(t testing.TB, nsPath string) *netlink.Handle {
	t.Helper()
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}
