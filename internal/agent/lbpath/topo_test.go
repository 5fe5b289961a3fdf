package lbpath

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// topo is a host namespace with a bridge (gateway 10.0.0.1/24) and pod
// namespaces on it, plus an "outside" namespace behind ext0
// (203.0.113.1/24 on the host, .2 outside).
type topo struct {
	host, out string
	pods      map[string]string // name -> netns path
	n         int
}

const (
	bridge = "lbtbr0"
	ext    = "lbtext0"
)

func newTopo(t testing.TB) *topo {
	t.Helper()
	testutil.RequireRoot(t)
	tp := &topo{pods: map[string]string{}}
	tp.host = nettest.NewNS(t, testutil.UniqueName("lbth"))
	tp.out = nettest.NewNS(t, testutil.UniqueName("lbto"))
	h := nettest.Name(tp.host)
	testutil.Run(t, "ip", "netns", "exec", h, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	nettest.IP(t, tp.host, "link", "add", bridge, "type", "bridge")
	nettest.IP(t, tp.host, "addr", "add", "10.0.0.1/24", "dev", bridge)
	nettest.IP(t, tp.host, "link", "set", bridge, "up")
	nettest.IP(t, tp.host, "link", "add", ext, "type", "veth", "peer", "name", "eth0", "netns", nettest.Name(tp.out))
	nettest.IP(t, tp.host, "addr", "add", "203.0.113.1/24", "dev", ext)
	nettest.IP(t, tp.host, "link", "set", ext, "up")
	nettest.IP(t, tp.out, "addr", "add", "203.0.113.2/24", "dev", "eth0")
	nettest.IP(t, tp.out, "link", "set", "eth0", "up")
	return tp
}

// pod adds a namespace with address addr (10.0.0.x) on the bridge.
func (tp *topo) pod(t *testing.T, name, addr string) string {
	t.Helper()
	p := nettest.NewNS(t, testutil.UniqueName("lbtp"))
	tp.n++
	hv := fmt.Sprintf("lbtv%d", tp.n)
	nettest.IP(t, tp.host, "link", "add", hv, "type", "veth", "peer", "name", "eth0", "netns", nettest.Name(p))
	nettest.IP(t, tp.host, "link", "set", hv, "master", bridge, "up")
	// As the agent's datapath plugs ports: hairpin on, so a member's
	// connection to its own VIP can come back through its port.
	nettest.IP(t, tp.host, "link", "set", hv, "type", "bridge_slave", "hairpin", "on")
	nettest.IP(t, p, "addr", "add", addr+"/24", "dev", "eth0")
	nettest.IP(t, p, "link", "set", "eth0", "up")
	nettest.IP(t, p, "route", "add", "default", "via", "10.0.0.1")
	tp.pods[name] = p
	return p
}

// serveWho answers every TCP connection on addr with name and the
// client's address ("name from a.b.c.d").
func serveWho(t *testing.T, nsPath, addr, name string) {
	t.Helper()
	var ln net.Listener
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) {
		h, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		_, _ = io.WriteString(c, name+" from "+h)
	})
}

// serveUDP answers every datagram on addr with name.
func serveUDP(t *testing.T, nsPath, addr, name string) {
	t.Helper()
	var pc net.PacketConn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		b := make([]byte, 100)
		for {
			_, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name), from)
		}
	}()
}

func dialUDP(nsPath, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hi")); err != nil {
		return "", err
	}
	b := make([]byte, 100)
	n, err := c.Read(b)
	return string(b[:n]), err
}

// who dials addr from nsPath and returns the server's name ("" and the
// error when it fails).
func who(nsPath, addr string) (string, error) {
	s, err := nettest.Dial(nsPath, addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(s, " from ")
	return name, nil
}

// eventually retries f until it returns nil or 10 s pass.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func newPath(t testing.TB, tp *topo, ext string) *Path {
	t.Helper()
	p, err := New(t.Context(), Config{HostNS: tp.host, Table: "lbt", ExtIface: ext})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
