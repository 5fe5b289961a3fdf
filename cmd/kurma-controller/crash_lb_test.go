package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

// TestKill9LoadBalancers: SIGKILL while clients create load balancers and
// churn floating IPs between ports; after a restart every acknowledged
// load balancer is there, no VIP is held twice, the VIP pool hands out
// exactly what is left, and no floating IP points at a missing target.
func TestKill9LoadBalancers(t *testing.T) {
	dir := t.TempDir()
	db := "bolt:" + filepath.Join(dir, "c.db")
	cmd, addr := start(t, "--listen", "127.0.0.1:0", "--store", db)
	c, _ := capi.New("http://" + addr)
	ctx := t.Context()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.CreateProject(ctx, capi.Project{ID: "p"}))
	must(c.CreateVPC(ctx, "p", capi.VPC{ID: "v", CIDR: "10.0.0.0/8"}))
	must(c.CreateSubnet(ctx, "p", capi.Subnet{ID: "s", NetworkID: "v", CIDR: "10.5.0.0/24"}))
	must(c.CreateSubnet(ctx, "p", capi.Subnet{ID: "svc", NetworkID: "v", CIDR: "10.96.0.0/23", Purpose: capi.SubnetPurposeService}))
	must(c.CreateExternalNetwork(ctx, capi.ExternalNetwork{ID: "ext", CIDR: "192.0.2.0/24"}))
	var mu sync.Mutex
	acked := map[string]string{} // load balancer id -> VIP
	var n atomic.Int64
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; lctx.Err() == nil; i++ {
				lb, err := c.CreateLoadBalancer(lctx, "p", capi.LoadBalancer{ID: fmt.Sprintf("w%d-%d", w, i), VIPSubnetID: "svc",
					Listeners: []capi.Listener{{Protocol: "TCP", Port: 80}}, Members: []capi.Member{{Address: "10.5.0.9"}}})
				if err != nil {
					return // the controller died
				}
				mu.Lock()
				acked[lb.ID] = lb.VIPAddress
				mu.Unlock()
				n.Add(1)
			}
		})
		wg.Go(func() {
			for i := 0; lctx.Err() == nil; i++ {
				port, err := c.CreatePort(lctx, "p", capi.Port{NetworkID: "s"})
				if err != nil {
					return
				}
				f, err := c.CreateFloatingIP(lctx, "p", capi.FloatingIP{FloatingNetworkID: "ext", PortID: port.ID})
				if err != nil {
					return
				}
				if err := c.DeletePort(lctx, "p", port.ID); err != nil {
					return
				}
				if i%2 == 0 {
					if err := c.DeleteFloatingIP(lctx, "p", f.ID); err != nil {
						return
					}
				}
			}
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for n.Load() < 40 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	stop()
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no load balancer was created before the kill")
	}

	_, addr = start(t, "--listen", "127.0.0.1:0", "--store", db)
	c, _ = capi.New("http://" + addr)
	lbs, err := c.ListLoadBalancers(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	stored := map[string]string{}
	for _, lb := range lbs {
		if other, dup := held[lb.VIPAddress]; dup {
			t.Fatalf("vip %s held by %s and %s after restart", lb.VIPAddress, other, lb.ID)
		}
		held[lb.VIPAddress], stored[lb.ID] = lb.ID, lb.VIPAddress
	}
	for id, vip := range acked {
		if stored[id] != vip {
			t.Fatalf("acknowledged load balancer %s (%s) lost after kill -9", id, vip)
		}
	}
	fips, err := c.ListFloatingIPs(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fips {
		if f.PortID == "" {
			continue
		}
		if _, err := c.GetPort(ctx, "p", f.PortID); err != nil {
			t.Fatalf("floating IP %s points at port %s: %v", f.ID, f.PortID, err)
		}
	}
	// The VIP pool's persisted state matches the load balancers exactly:
	// a /23 has 509 allocatable addresses.
	more := 0
	for {
		lb, err := c.CreateLoadBalancer(ctx, "p", capi.LoadBalancer{VIPSubnetID: "svc"})
		if err != nil {
			break
		}
		if _, dup := held[lb.VIPAddress]; dup {
			t.Fatalf("vip %s handed out twice after restart", lb.VIPAddress)
		}
		more++
	}
	if more != 509-len(lbs) {
		t.Fatalf("after restart %d more VIPs, want %d (stored %d, acked %d)", more, 509-len(lbs), len(lbs), len(acked))
	}
	t.Logf("killed with %d acknowledged load balancers, %d stored, %d floating IPs", len(acked), len(lbs), len(fips))
}
