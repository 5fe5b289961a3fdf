package kubecluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/testutil"
)

// TestUnderlayNodePortHairpin builds the underlay of a two-node cluster
// (no daemons) and checks the path that failed at random in the upstream
// node-port specs on two nodes, for kube-proxy and Kurma alike: a client
// on node 2 reaches a node port of node 1 whose endpoint is on node 2
// (here node 2's own address, as a hostNetwork endpoint), over TCP and
// UDP. Node 1 translates as kube-proxy does (DNAT in prerouting,
// masquerade), with bridge netfilter on in its namespace, as the nodes'
// own bridges need it. With the underlay's bridge in node 1's namespace,
// the kernel bridged the translated packet back out the port it came in
// by, and dropped it.
func TestUnderlayNodePortHairpin(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft binary")
	}
	c := &Cluster{Dir: t.TempDir()}
	c.netns = testutil.NewNetNS(t)
	c.NetNS = c.netns.Path()
	c.node0 = &Node{Name: "n1", IP: NodeIP, NetNS: c.NetNS, c: c, netns: c.netns}
	t.Cleanup(func() {
		if c.switchNS != nil {
			_ = c.switchNS.Close()
			if err := testutil.RemoveNetNS(c.SwitchNetNS); err != nil {
				t.Error(err)
			}
		}
	})
	node2 := testutil.NewNetNS(t)
	ip2 := nodeIP(1)
	const nodePort, target = 30080, 8080
	rules := fmt.Sprintf(`table ip kkct {
	chain pre {
		type nat hook prerouting priority dstnat;
		ip daddr %[1]s tcp dport %[2]d dnat to %[3]s:%[4]d
		ip daddr %[1]s udp dport %[2]d dnat to %[3]s:%[4]d
	}
	chain post {
		type nat hook postrouting priority srcnat;
		ct status dnat masquerade
	}
}
`, NodeIP, nodePort, ip2, target)
	err := c.node0.Do(func() error {
		if err := setupLoopback(); err != nil {
			return err
		}
		for k, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"} {
			if _, err := os.Stat("/proc/sys/" + k); err != nil {
				continue
			}
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %w: %s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.addSwitch(); err != nil {
		t.Fatal(err)
	}
	if err := node2.Do(func(ns.NetNS) error { return plugUnderlay(UnderlayLink, ip2, 1, int(c.switchNS.Fd())) }); err != nil {
		t.Fatal(err)
	}
	if err := c.switchNS.Do(func(ns.NetNS) error { return joinSwitch(1) }); err != nil {
		t.Fatal(err)
	}

	// The endpoint on node 2: a TCP server that writes "n2" and closes,
	// a UDP one that answers each datagram with "n2".
	addr := net.JoinHostPort(ip2, fmt.Sprint(target))
	var ln net.Listener
	var pc net.PacketConn
	if err := node2.Do(func(ns.NetNS) error {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) { _, _ = c.Write([]byte("n2")) })
	testutil.ServeDatagrams(t, pc, func(net.Addr) []byte { return []byte("n2") })

	to := net.JoinHostPort(NodeIP, fmt.Sprint(nodePort))
	for _, network := range []string{"tcp", "udp"} {
		deadline := time.Now().Add(10 * time.Second)
		var got string
		var err error
		for {
			got, err = dialOnce(t.Context(), node2, network, to)
			if err == nil && got == "n2" || time.Now().After(deadline) {
				break
			}
			select { // a pause between tries
			case <-t.Context().Done():
				t.Fatal(t.Context().Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
		t.Logf("%s: %q after %v (%v)", network, got, time.Since(deadline.Add(-10*time.Second)).Round(time.Millisecond), err)
		if err != nil || got != "n2" {
			t.Errorf("%s from node 2 to node 1's node port %s (endpoint %s): got %q, %v", network, to, addr, got, err)
		}
	}
}

// dialOnce dials addr from the namespace n, sends a line and reads the
// answer, within a second.
func dialOnce(ctx context.Context, n ns.NetNS, network, addr string) (string, error) {
	var conn net.Conn
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := n.Do(func(ns.NetNS) error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	}); err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	if _, err := conn.Write([]byte("hi\n")); err != nil {
		return "", err
	}
	b := make([]byte, 64)
	k, err := conn.Read(b)
	if err != nil && err != io.EOF {
		return string(b[:k]), err
	}
	return string(b[:k]), nil
}
