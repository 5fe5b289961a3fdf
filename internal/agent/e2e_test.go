package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestThreeHosts: three hosts, two VPCs. Ports created through the API on
// different hosts become UP and reach each other over TCP; the other VPC
// cannot reach them, on the same host or across hosts; a vanished pod
// namespace turns its port DOWN; a deleted port disappears.
func TestThreeHosts(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	snA := c.network(ctx, pid, "vpc-a", "10.10.1.0/24")
	snB := c.network(ctx, pid, "vpc-b", "10.20.1.0/24")
	h1, h2, h3 := c.hosts[0], c.hosts[1], c.hosts[2]
	a1 := c.newPod(ctx, t, pid, snA.ID, h1)
	a2 := c.newPod(ctx, t, pid, snA.ID, h2)
	a3 := c.newPod(ctx, t, pid, snA.ID, h3)
	b1 := c.newPod(ctx, t, pid, snB.ID, h1)
	b3 := c.newPod(ctx, t, pid, snB.ID, h3)
	pods := []pod{a1, a2, a3, b1, b3}
	c.waitUp(ctx, t, pid, pods...)
	a1, a2, a3, b1, b3 = pods[0], pods[1], pods[2], pods[3], pods[4]
	for i, p := range pods {
		nettest.Serve(t, p.ns, p.ip()+":8000", fmt.Sprint(i))
	}

	t.Run("same vpc reaches across hosts", func(t *testing.T) {
		for _, pair := range [][2]int{{0, 1}, {1, 2}, {2, 0}, {3, 4}, {4, 3}} {
			from, to := pods[pair[0]], pods[pair[1]]
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := nettest.Reach(rctx, from.ns, to.ip()+":8000", fmt.Sprint(pair[1]))
			cancel()
			if err != nil {
				t.Errorf("%s -> %s: %v", from.port.BindingHostID, to.port.BindingHostID, err)
			}
		}
	})
	t.Run("other vpc cannot reach", func(t *testing.T) {
		for _, pair := range [][2]pod{{b1, a1}, {b3, a2}, {b3, a1}, {a1, b3}, {a3, b1}} {
			if got, err := nettest.Dial(pair[0].ns, pair[1].ip()+":8000", 700*time.Millisecond); err == nil {
				t.Errorf("%s (%s) reached %s (%s): %q", pair[0].ip(), pair[0].port.VPCID, pair[1].ip(), pair[1].port.VPCID, got)
			}
		}
	})
	t.Run("spoofed source address is dropped", func(t *testing.T) {
		// a1 takes an address its port does not own; the guard on h1
		// (port_security, on by default) drops what it sends from it, so
		// the dial times out. The agent's resync also removes the extra
		// address from the pod: then the dial fails locally, and is tried
		// again.
		var err error
		for range 5 {
			nettest.IP(t, a1.ns, "addr", "replace", "10.10.1.250/24", "dev", "eth0")
			var got string
			got, err = nettest.DialFrom(a1.ns, "10.10.1.250", a2.ip()+":8000", 700*time.Millisecond)
			if err == nil {
				t.Fatalf("a1 reached a2 from a spoofed address: %q", got)
			}
			if os.IsTimeout(err) {
				break
			}
		}
		if !os.IsTimeout(err) {
			t.Fatalf("spoofed dial failed without a timeout: %v", err)
		}
		if got, err := nettest.DialFrom(a1.ns, a1.ip(), a2.ip()+":8000", 2*time.Second); err != nil || got != "1" {
			t.Errorf("a1 from its own address: %q, %v", got, err)
		}
	})
	t.Run("each port plugged once", func(t *testing.T) {
		for _, h := range c.hosts {
			for id, n := range ownedPorts(t, h.ns) {
				if n != 1 {
					t.Errorf("%s: port %s has %d host links", h.id, id, n)
				}
			}
		}
		if got := ownedPorts(t, h1.ns); len(got) != 2 {
			t.Errorf("h1 owns %v, want a1 and b1", got)
		}
	})
	t.Run("vanished netns marks the port down", func(t *testing.T) {
		nettest.DelNS(nettest.Name(a2.ns))
		got := c.waitStatus(ctx, t, pid, a2.port.ID, controllerapi.StatusDown)
		if !strings.Contains(got.StatusReason, "does not exist") {
			t.Errorf("reason %q", got.StatusReason)
		}
		if n := ownedPorts(t, h2.ns)[a2.port.ID]; n != 0 {
			t.Errorf("h2 still has %d links for the vanished port", n)
		}
	})
	t.Run("deleted port is unplugged", func(t *testing.T) {
		if err := c.c.DeletePort(ctx, pid, a3.port.ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a3's eth0 removed", func() bool {
			return slices.Equal(nettest.Links(t, a3.ns), []string{"lo"})
		})
		if n := ownedPorts(t, h3.ns)[a3.port.ID]; n != 0 {
			t.Errorf("h3 still has %d links for the deleted port", n)
		}
		// b3 keeps VPC B alive on h3; VPC A's devices go with its last port.
		waitFor(t, 10*time.Second, "vpc a removed from h3", func() bool {
			return countPrefix(nettest.Links(t, h3.ns), pfx+"b") == 1
		})
	})
	t.Run("vpc joining a host later gets its peers", func(t *testing.T) {
		// VPC C exists on h3 first; h2 joins it afterwards, so h2's agent
		// only learns of c3 from the listing its controller watch sends
		// when c2 brings the VPC (it was filtered out before).
		snC := c.network(ctx, pid, "vpc-c", "10.30.1.0/24")
		c3 := c.newPod(ctx, t, pid, snC.ID, h3)
		c.waitUp(ctx, t, pid, c3)
		c2 := c.newPod(ctx, t, pid, snC.ID, h2)
		c.waitUp(ctx, t, pid, c2)
		nettest.Serve(t, c3.ns, c3.ip()+":8000", "c3")
		nettest.Serve(t, c2.ns, c2.ip()+":8000", "c2")
		for _, tc := range []struct {
			from, to pod
			want     string
		}{{c2, c3, "c3"}, {c3, c2, "c2"}} {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := nettest.Reach(rctx, tc.from.ns, tc.to.ip()+":8000", tc.want)
			cancel()
			if err != nil {
				t.Errorf("%s -> %s: %v", tc.from.port.BindingHostID, tc.to.port.BindingHostID, err)
			}
		}
	})
	t.Run("sigterm exits cleanly and leaves ports", func(t *testing.T) {
		if err := h1.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-h1.proc.done:
		case <-time.After(10 * time.Second):
			t.Fatal("agent did not exit on SIGTERM")
		}
		if code := h1.proc.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		if got := ownedPorts(t, h1.ns); len(got) != 2 {
			t.Fatalf("ports after a graceful stop: %v", got)
		}
	})
}

// TestAgentKill9Churn: the agent of h1 is killed with SIGKILL in the middle
// of a churn of creates and deletes, and restarted. Afterwards every
// surviving port is UP with exactly one link, every deleted one is gone
// from its namespace, h1 has no other link of ours, and h2's view of h1's
// ports (its FDB) matches the survivors.
func TestAgentKill9Churn(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "churn"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "vpc", "10.30.0.0/22")
	h1, h2 := c.hosts[0], c.hosts[1]
	anchor := c.newPod(ctx, t, pid, sn.ID, h2)
	c.waitUp(ctx, t, pid, anchor)

	const total = 36
	var (
		mu      sync.Mutex
		live    []pod
		deleted []pod
	)
	for i := range total {
		p := c.newPod(ctx, t, pid, sn.ID, h1)
		mu.Lock()
		live = append(live, p)
		if i%3 == 2 {
			victim := live[len(live)/2]
			live = slices.Delete(live, len(live)/2, len(live)/2+1)
			if err := c.c.DeletePort(ctx, pid, victim.port.ID); err != nil {
				t.Fatalf("delete port: %v", err)
			}
			deleted = append(deleted, victim)
		}
		mu.Unlock()
		if i == total/3 {
			h1.proc.kill9()
		}
		if i == 2*total/3 {
			c.startAgent(h1)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.waitUp(ctx, t, pid, live...)

	t.Run("deleted ports are gone", func(t *testing.T) {
		for _, p := range deleted {
			waitFor(t, 10*time.Second, "eth0 removed from "+p.ns, func() bool {
				return slices.Equal(nettest.Links(t, p.ns), []string{"lo"})
			})
		}
	})
	t.Run("survivors plugged exactly once", func(t *testing.T) {
		owned := ownedPorts(t, h1.ns)
		if len(owned) != len(live) {
			t.Errorf("h1 owns %d ports, want %d", len(owned), len(live))
		}
		for _, p := range live {
			if owned[p.port.ID] != 1 {
				t.Errorf("port %s has %d links", p.port.ID, owned[p.port.ID])
			}
			if got := nettest.Links(t, p.ns); !slices.Equal(got, []string{"lo", "eth0"}) {
				t.Errorf("pod %s links %v", p.ns, got)
			}
		}
	})
	t.Run("no leaked links", func(t *testing.T) {
		// lo, the underlay veth, one bridge, one vxlan, one veth per survivor.
		links := nettest.Links(t, h1.ns)
		if want := 4 + len(live); len(links) != want {
			t.Errorf("h1 has %d links, want %d: %v", len(links), want, links)
		}
	})
	t.Run("remote fdb matches survivors", func(t *testing.T) {
		waitFor(t, 10*time.Second, "h2 fdb", func() bool {
			out := testutil.Run(t, "bridge", "-n", nettest.Name(h2.ns), "fdb", "show")
			return strings.Count(out, "dst 192.0.2.1") == len(live)
		})
	})
	t.Run("survivors reach the remote anchor", func(t *testing.T) {
		nettest.Serve(t, anchor.ns, anchor.ip()+":8000", "anchor")
		for _, p := range []pod{live[0], live[len(live)-1]} {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := nettest.Reach(rctx, p.ns, anchor.ip()+":8000", "anchor")
			cancel()
			if err != nil {
				t.Error(err)
			}
		}
	})
}

func waitFor(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countPrefix(names []string, prefix string) int {
	n := 0
	for _, s := range names {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// TestControllerKill9: the controller is killed with SIGKILL while ports
// are being created and deleted, and restarted on the same store. The
// agents' watches reconnect (resuming, or re-listing when the revision is
// gone) and converge: every surviving port UP with one link, deleted ones
// unplugged.
func TestControllerKill9(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "ctl-restart"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "vpc", "10.40.0.0/24")
	var live, deleted []pod
	for i := range 12 {
		live = append(live, c.newPod(ctx, t, pid, sn.ID, c.hosts[i%2]))
	}
	c.waitUp(ctx, t, pid, live...)
	c.ctl.kill9()
	c.startController()
	for i := range 6 {
		victim := live[0]
		live = live[1:]
		if err := c.c.DeletePort(ctx, pid, victim.port.ID); err != nil {
			t.Fatal(err)
		}
		deleted = append(deleted, victim)
		live = append(live, c.newPod(ctx, t, pid, sn.ID, c.hosts[i%2]))
	}
	c.waitUp(ctx, t, pid, live...)
	for _, p := range deleted {
		waitFor(t, 10*time.Second, "eth0 removed from "+p.ns, func() bool {
			return slices.Equal(nettest.Links(t, p.ns), []string{"lo"})
		})
	}
	want := map[string]int{}
	for _, p := range live {
		want[p.port.BindingHostID]++
	}
	for _, h := range c.hosts {
		owned := ownedPorts(t, h.ns)
		if len(owned) != want[h.id] {
			t.Errorf("%s owns %d ports, want %d", h.id, len(owned), want[h.id])
		}
		for id, n := range owned {
			if n != 1 {
				t.Errorf("%s: port %s has %d links", h.id, id, n)
			}
		}
	}
	nettest.Serve(t, live[0].ns, live[0].ip()+":8000", "first")
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := nettest.Reach(rctx, live[len(live)-1].ns, live[0].ip()+":8000", "first"); err != nil {
		t.Error(err)
	}
}
