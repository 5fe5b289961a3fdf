package agent_test

import (
	"context"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestRemoteOnlySubnet: two subnets of one VPC, each with its only port on
// a different host. Each host has a port in just one of them, so the other
// subnet is on-link there only because the agent puts the gateways of its
// remote ports' subnets on the bridge; without them the packet meets the
// host's routing table and is lost (a Kubernetes pod on a second node
// could not reach a pod of another namespace).
func TestRemoteOnlySubnet(t *testing.T) {
	c := newCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "remote-only"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	snA := c.network(ctx, pid, "vpc-ro", "10.31.1.0/24")
	snB, err := c.c.CreateSubnet(ctx, pid, controllerapi.Subnet{Name: "ro-b", NetworkID: snA.NetworkID, CIDR: "10.31.2.0/24", IPVersion: 4})
	if err != nil {
		t.Fatal(err)
	}
	pods := []pod{c.newPod(ctx, t, pid, snA.ID, c.hosts[0]), c.newPod(ctx, t, pid, snB.ID, c.hosts[1])}
	c.waitUp(ctx, t, pid, pods...)
	nettest.Serve(t, pods[0].ns, pods[0].ip()+":8000", "a")
	nettest.Serve(t, pods[1].ns, pods[1].ip()+":8000", "b")
	for _, tc := range []struct {
		name     string
		from, to pod
		want     string
	}{
		{"b on host 2 reaches a on host 1", pods[1], pods[0], "a"},
		{"a on host 1 reaches b on host 2", pods[0], pods[1], "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if err := nettest.Reach(rctx, tc.from.ns, tc.to.ip()+":8000", tc.want); err != nil {
				t.Fatalf("%s -> %s: %v", tc.from.ip(), tc.to.ip(), err)
			}
		})
	}
}
