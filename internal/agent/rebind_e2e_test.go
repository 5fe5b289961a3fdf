package agent_test

import (
	"context"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestRebindNewHostID: a node whose host id changes (Kubernetes: the
// Node's kurma.dev/host-id annotation) has its ports rebound in place
// (PUT .../ports/<id>/binding: same MAC and addresses, PENDING); its
// agent, killed and restarted under the new id, adopts the ports it
// plugged under the old one: each is reported UP again, keeps one host
// end, and the pods still reach each other.
func TestRebindNewHostID(t *testing.T) {
	c := newCluster(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "rebind"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "vpc", "10.40.0.0/24")
	h := c.hosts[0]
	pods := []pod{c.newPod(ctx, t, pid, sn.ID, h), c.newPod(ctx, t, pid, sn.ID, h)}
	c.waitUp(ctx, t, pid, pods...)
	nettest.Serve(t, pods[1].ns, pods[1].ip()+":8000", "b")
	if err := nettest.Reach(ctx, pods[0].ns, pods[1].ip()+":8000", "b"); err != nil {
		t.Fatalf("before the rebind: %v", err)
	}

	h.proc.kill9()
	newID := h.id + "-new"
	for _, p := range pods {
		got, err := c.c.SetPortBinding(ctx, pid, p.port.ID, newID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != controllerapi.StatusPending || got.MACAddress != p.port.MACAddress || got.FixedIPs[0].IPAddress != p.ip() {
			t.Fatalf("rebound port %s: %s, %s, %s; want PENDING with MAC %s and %s", p.port.ID, got.Status, got.MACAddress,
				got.FixedIPs[0].IPAddress, p.port.MACAddress, p.ip())
		}
	}
	h.id = newID
	c.startAgent(h)
	for _, p := range pods {
		got := c.waitStatus(ctx, t, pid, p.port.ID, controllerapi.StatusUp)
		if got.BindingHostID != newID {
			t.Fatalf("port %s bound to %s after the restart, want %s", p.port.ID, got.BindingHostID, newID)
		}
	}
	owned := ownedPorts(t, h.ns)
	for _, p := range pods {
		if owned[p.port.ID] != 1 {
			t.Fatalf("port %s has %d host ends after the restart, want 1 (all: %v)", p.port.ID, owned[p.port.ID], owned)
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := nettest.Reach(rctx, pods[0].ns, pods[1].ip()+":8000", "b"); err != nil {
		t.Fatalf("after the restart under the new host id: %v", err)
	}
}
