package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// TestEtcdReplicasKill9Churn is the crash test with the etcd backend and
// two controller replicas on it: h1's agent uses replica 0, h2's replica
// 1, and two clients churn creates and deletes through both replicas at
// once. Mid-churn h1's agent and replica 1 are killed with SIGKILL and
// etcd's history is compacted past every watch's revision; then both are
// restarted. Afterwards every surviving port is UP with exactly one link,
// deleted ones are gone from the API and their namespaces, no address or
// MAC is held twice, no link of ours is left over, each host's FDB holds
// exactly the other host's survivors, and old revisions answer Gone on
// both replicas.
func TestEtcdReplicasKill9Churn(t *testing.T) {
	c := newClusterOpts(t, 2, clusterOpts{etcd: true, replicas: 2})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	proj, err := c.c.CreateProject(ctx, controllerapi.Project{Name: "replicas"})
	if err != nil {
		t.Fatal(err)
	}
	pid := proj.ID
	sn := c.network(ctx, pid, "vpc", "10.50.0.0/24")
	h1, h2 := c.hosts[0], c.hosts[1]
	anchor := c.newPod(ctx, t, pid, sn.ID, h2)
	c.waitUp(ctx, t, pid, anchor)
	oldRev := anchor.port.RevisionNumber

	const perWorker = 24
	type result struct{ live, deleted []pod }
	results := make([]result, 2)
	nss := make([][]string, 2) // namespaces made here: workers must not t.Fatal
	for w := range 2 {
		for range perWorker {
			nss[w] = append(nss[w], nettest.NewNS(t, testutil.UniqueName(pfx)))
		}
	}
	progress := make(chan int, 2*perWorker)
	var failed atomic.Int64 // requests that failed and were retried
	// Worker 1 (replica 1's client) holds at a third of its work until
	// replica 1 is dead, so that it meets the dead replica however the two
	// workers' speeds differ under load.
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			cli := c.clients[w]
			r := &results[w]
			for i := range perWorker {
				if w == 1 && i == perWorker/3 {
					select {
					case <-killed:
					case <-ctx.Done():
					}
				}
				h := c.hosts[i%2]
				want := controllerapi.Port{
					ID: fmt.Sprintf("w%d-%02d", w, i), Name: nettest.Name(nss[w][i]), NetworkID: sn.ID,
					VethName: "eth0", NetworkNS: nss[w][i], BindingHostID: h.id,
				}
				p, err := createRetry(ctx, cli, pid, want, &failed)
				if err != nil {
					t.Errorf("worker %d: create %s: %v", w, want.ID, err)
					return
				}
				r.live = append(r.live, pod{port: p, ns: nss[w][i]})
				if i%3 == 2 {
					victim := r.live[len(r.live)/2]
					r.live = slices.Delete(r.live, len(r.live)/2, len(r.live)/2+1)
					if err := deleteRetry(ctx, cli, pid, victim.port.ID, &failed); err != nil {
						t.Errorf("worker %d: delete %s: %v", w, victim.port.ID, err)
						return
					}
					r.deleted = append(r.deleted, victim)
				}
				if w == 0 {
					progress <- i
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	restarted := false
	for i := range progress {
		if i == perWorker/3 {
			h1.proc.kill9()
			c.ctls[1].kill9()
			compact(t, c, revisionOf(ctx, t, c))
			close(killed)
		}
		if i == 2*perWorker/3 {
			// Replica 1 comes back only after its worker met it dead.
			for failed.Load() == 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			c.startAgent(h1)
			c.startReplica(1)
			restarted = true
		}
		if i == perWorker-1 {
			break
		}
	}
	wg.Wait()
	if t.Failed() || !restarted {
		t.FailNow()
	}
	if failed.Load() == 0 {
		t.Fatal("no request failed: replica 1 was not killed during its worker's churn")
	}
	var live, deleted []pod
	for _, r := range results {
		live, deleted = append(live, r.live...), append(deleted, r.deleted...)
	}
	c.waitUp(ctx, t, pid, live...)
	live = append(live, anchor)

	t.Run("old revisions are gone on both replicas", func(t *testing.T) {
		for i, cli := range c.clients {
			for _, err := range cli.WatchPorts(ctx, oldRev, "") {
				if !errors.Is(err, controllerapi.ErrCompacted) {
					t.Errorf("replica %d: watch since %d: %v, want ErrCompacted", i, oldRev, err)
				}
				break
			}
		}
	})
	t.Run("api holds the survivors with unique addresses", func(t *testing.T) {
		for i, cli := range c.clients {
			ports, err := cli.ListPorts(ctx, pid, controllerapi.PortFilter{})
			if err != nil {
				t.Fatal(err)
			}
			ids, ips, macs := map[string]bool{}, map[string]string{}, map[string]string{}
			for _, p := range ports {
				ids[p.ID] = true
				for _, f := range p.FixedIPs {
					if o, dup := ips[f.IPAddress]; dup {
						t.Errorf("replica %d: %s held by %s and %s", i, f.IPAddress, o, p.ID)
					}
					ips[f.IPAddress] = p.ID
				}
				if o, dup := macs[p.MACAddress]; dup {
					t.Errorf("replica %d: mac %s held by %s and %s", i, p.MACAddress, o, p.ID)
				}
				macs[p.MACAddress] = p.ID
			}
			for _, p := range live {
				if !ids[p.port.ID] {
					t.Errorf("replica %d: survivor %s missing", i, p.port.ID)
				}
			}
			for _, p := range deleted {
				if ids[p.port.ID] {
					t.Errorf("replica %d: deleted %s still listed", i, p.port.ID)
				}
			}
			if len(ports) != len(live) {
				t.Errorf("replica %d lists %d ports, want %d", i, len(ports), len(live))
			}
		}
	})
	t.Run("deleted ports are unplugged", func(t *testing.T) {
		for _, p := range deleted {
			waitFor(t, 10*time.Second, "eth0 removed from "+p.ns, func() bool {
				return slices.Equal(nettest.Links(t, p.ns), []string{"lo"})
			})
		}
	})
	onHost := map[string]int{}
	for _, p := range live {
		onHost[p.port.BindingHostID]++
	}
	t.Run("survivors plugged exactly once, no leaked links", func(t *testing.T) {
		for _, h := range c.hosts {
			owned := ownedPorts(t, h.ns)
			if len(owned) != onHost[h.id] {
				t.Errorf("%s owns %d ports, want %d", h.id, len(owned), onHost[h.id])
			}
			for id, n := range owned {
				if n != 1 {
					t.Errorf("%s: port %s has %d links", h.id, id, n)
				}
			}
			// lo, the underlay veth, one bridge, one vxlan, one veth per port.
			if links := nettest.Links(t, h.ns); len(links) != 4+onHost[h.id] {
				t.Errorf("%s has %d links, want %d: %v", h.id, len(links), 4+onHost[h.id], links)
			}
		}
		for _, p := range live {
			if got := nettest.Links(t, p.ns); !slices.Equal(got, []string{"lo", "eth0"}) {
				t.Errorf("pod %s links %v", p.ns, got)
			}
		}
	})
	t.Run("each fdb holds the other host's survivors", func(t *testing.T) {
		for _, pair := range [][2]*host{{h1, h2}, {h2, h1}} {
			waitFor(t, 10*time.Second, pair[0].id+" fdb", func() bool {
				out := testutil.Run(t, "bridge", "-n", nettest.Name(pair[0].ns), "fdb", "show")
				return strings.Count(out, "dst "+pair[1].ip) == onHost[pair[1].id]
			})
		}
	})
	t.Run("survivors reach the anchor across hosts", func(t *testing.T) {
		nettest.Serve(t, anchor.ns, anchor.ip()+":8000", "anchor")
		for _, p := range live {
			if p.port.BindingHostID != h1.id {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := nettest.Reach(rctx, p.ns, anchor.ip()+":8000", "anchor")
			cancel()
			if err != nil {
				t.Error(err)
			}
		}
	})
}

// retry runs f until it succeeds, answers a final error, or 30 s pass:
// while a replica is down its requests fail to connect.
func retry(ctx context.Context, failed *atomic.Int64, f func() (final bool, err error)) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		final, err := f()
		if err == nil || final || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		failed.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

// createRetry creates a port with a client-chosen id; a 409 on a retry
// means an earlier attempt whose answer was lost did create it.
func createRetry(ctx context.Context, cli *controllerapi.Client, pid string, want controllerapi.Port, failed *atomic.Int64) (*controllerapi.Port, error) {
	var out *controllerapi.Port
	tries := 0
	err := retry(ctx, failed, func() (bool, error) {
		tries++
		p, err := cli.CreatePort(ctx, pid, want)
		if errors.Is(err, kerrors.Conflict) && tries > 1 {
			p, err = cli.GetPort(ctx, pid, want.ID)
		}
		out = p
		return errors.Is(err, kerrors.Conflict) || errors.Is(err, kerrors.Invalid), err
	})
	return out, err
}

func deleteRetry(ctx context.Context, cli *controllerapi.Client, pid, id string, failed *atomic.Int64) error {
	tries := 0
	return retry(ctx, failed, func() (bool, error) {
		tries++
		err := cli.DeletePort(ctx, pid, id)
		if errors.Is(err, kerrors.NotFound) && tries > 1 {
			return true, nil
		}
		return errors.Is(err, kerrors.NotFound), err
	})
}

// revisionOf returns etcd's current revision, through replica 0.
func revisionOf(ctx context.Context, t *testing.T, c *cluster) int64 {
	t.Helper()
	for ev, err := range c.c.WatchPorts(ctx, 0, "no-such-host") {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == controllerapi.EventSynced {
			return ev.Revision
		}
	}
	t.Fatal("no SYNCED")
	return 0
}

// compact compacts etcd's history up to rev through its JSON gateway.
func compact(t *testing.T, c *cluster, rev int64) {
	t.Helper()
	hc := nsHTTPClient(c.ul)
	body := fmt.Sprintf(`{"revision":%d,"physical":true}`, rev)
	u := strings.TrimPrefix(c.storeSpec, "etcd:") + "/v3/kv/compaction"
	resp, err := hc.Post(u, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compact: %s", resp.Status)
	}
}
