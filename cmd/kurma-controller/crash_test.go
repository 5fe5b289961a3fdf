package main

import (
	"context"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

// TestKill9UnderLoad: SIGKILL while clients create ports; after a restart
// every acknowledged port is there, no address is held twice, and the
// freed capacity is exactly what the stored ports leave.
func TestKill9UnderLoad(t *testing.T) {
	dir := t.TempDir()
	db := "bolt:" + filepath.Join(dir, "c.db")
	cmd, addr := start(t, "--listen", "127.0.0.1:0", "--store", db)
	c, _ := capi.New("http://" + addr)
	ctx := t.Context()
	if _, err := c.CreateProject(ctx, capi.Project{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVPC(ctx, "p", capi.VPC{ID: "v"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSubnet(ctx, "p", capi.Subnet{ID: "s", NetworkID: "v", CIDR: "10.5.0.0/23"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := map[string]string{} // port id -> address
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for lctx.Err() == nil {
				p, err := c.CreatePort(lctx, "p", capi.Port{NetworkID: "s"})
				if err != nil {
					return // the controller died
				}
				mu.Lock()
				acked[p.ID] = p.FixedIPs[0].IPAddress
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	stop()
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no port was created before the kill")
	}

	_, addr = start(t, "--listen", "127.0.0.1:0", "--store", db)
	c, _ = capi.New("http://" + addr)
	ports, err := c.ListPorts(ctx, "p", capi.PortFilter{})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	held := map[string]string{}
	for _, p := range ports {
		ip := p.FixedIPs[0].IPAddress
		if other, dup := held[ip]; dup {
			t.Fatalf("address %s held by %s and %s after restart", ip, other, p.ID)
		}
		held[ip], stored[p.ID] = p.ID, ip
	}
	for id, ip := range acked {
		if stored[id] != ip {
			t.Fatalf("acknowledged port %s (%s) lost after kill -9", id, ip)
		}
	}
	// The allocator's persisted state matches the ports exactly: it hands
	// out precisely the remaining 509 - len(ports) addresses.
	n := 0
	for {
		p, err := c.CreatePort(ctx, "p", capi.Port{NetworkID: "s"})
		if err != nil {
			break
		}
		if _, dup := held[p.FixedIPs[0].IPAddress]; dup {
			t.Fatalf("address %s handed out twice after restart", p.FixedIPs[0].IPAddress)
		}
		n++
	}
	if n != 509-len(ports) {
		t.Fatalf("after restart %d more addresses, want %d (stored %d ports, acked %d)", n, 509-len(ports), len(ports), len(acked))
	}
	t.Logf("killed with %d acknowledged ports, %d stored", len(acked), len(ports))
}
