package api_test

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/etcdtest"
	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	"kurma.dev/kurma/internal/controller/store/etcdstore"
	"kurma.dev/kurma/internal/testutil"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestRestartKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "restart.db")
	st1, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e1 := newServer(t, st1, "")
	e1.setup(t, "10.70.0.0/28")
	first := map[string]bool{}
	for range 5 {
		p, err := e1.cli.CreatePort(t.Context(), "p1", capi.Port{NetworkID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		first[p.FixedIPs[0].IPAddress] = true
	}
	rev, _ := st1.Rev(t.Context())
	if err := st1.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st2.Close() })
	e2 := newServer(t, st2, "")
	if n := len(listAll(t, &env{cli: e2.cli, pid: "p1"})); n != 5 {
		t.Fatalf("%d ports after restart, want 5", n)
	}
	for i := 0; ; i++ {
		p, err := e2.cli.CreatePort(t.Context(), "p1", capi.Port{NetworkID: "s1"})
		if errors.Is(err, kerrors.Exhausted) {
			if i != 13-5 {
				t.Fatalf("exhausted after %d more, want %d", i, 13-5)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first[p.FixedIPs[0].IPAddress] {
			t.Fatalf("address %s reused after restart", p.FixedIPs[0].IPAddress)
		}
	}
	// A watch older than the restart must re-list.
	for _, err := range e2.cli.WatchPorts(t.Context(), rev-1, "") {
		if !errors.Is(err, capi.ErrCompacted) {
			t.Fatalf("watch across restart = %v, want ErrCompacted", err)
		}
		break
	}
}

// replicas starts n controllers sharing one real etcd.
func replicas(t *testing.T, n int) []*env {
	srv := etcdtest.StartT(t)
	prefix := "/" + testutil.UniqueName("kctl") + "/"
	var out []*env
	for range n {
		st, err := etcdstore.Open(t.Context(), etcdstore.Options{Endpoints: []string{srv.ClientURL}, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		out = append(out, newServer(t, store.Store(st), ""))
	}
	return out
}

func TestTwoReplicasOnEtcd(t *testing.T) {
	rs := replicas(t, 2)
	rs[0].setup(t, "10.99.0.0/26") // 61 allocatable addresses
	ctx := t.Context()

	var mu sync.Mutex
	ips := map[string]string{}
	exhausted := 0
	var wg sync.WaitGroup
	for w := range 8 {
		c := rs[w%2].cli
		wg.Go(func() {
			for {
				var ps []capi.Port
				var err error
				if w%3 == 0 {
					ps, err = c.CreatePorts(ctx, "p1", []capi.Port{{NetworkID: "s1"}, {NetworkID: "s1"}})
				} else {
					var p *capi.Port
					if p, err = c.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"}); p != nil {
						ps = []capi.Port{*p}
					}
				}
				if errors.Is(err, kerrors.Exhausted) {
					mu.Lock()
					exhausted++
					mu.Unlock()
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, p := range ps {
					ip := p.FixedIPs[0].IPAddress
					if prev, dup := ips[ip]; dup {
						t.Errorf("address %s given to %s and %s", ip, prev, p.ID)
					}
					ips[ip] = p.ID
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Bulk workers may stop with one address left over.
	if len(ips) < 60 || len(ips) > 61 {
		t.Fatalf("%d addresses handed out across replicas, want 60-61", len(ips))
	}
	all, err := rs[1].cli.ListPorts(ctx, "p1", capi.PortFilter{})
	if err != nil || len(all) != len(ips) {
		t.Fatalf("stored %d ports (%v), handed out %d", len(all), err, len(ips))
	}

	// Status set through one replica wakes a long poll on the other.
	id := all[0].ID
	go func() {
		time.Sleep(100 * time.Millisecond)
		if _, err := rs[1].cli.SetPortStatus(ctx, "p1", id, capi.StatusUp, ""); err != nil {
			t.Error(err)
		}
	}()
	p, err := rs[0].cli.WaitPort(ctx, "p1", id, capi.StatusUp, 10*time.Second)
	if err != nil || p.Status != capi.StatusUp {
		t.Fatalf("cross-replica WaitPort = %+v, %v", p, err)
	}

	// An address freed on one replica is reused by the other.
	if err := rs[1].cli.DeletePort(ctx, "p1", all[1].ID); err != nil {
		t.Fatal(err)
	}
	if len(ips) == 61 {
		np, err := rs[0].cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"})
		if err != nil || np.FixedIPs[0].IPAddress != all[1].FixedIPs[0].IPAddress {
			t.Fatalf("reuse across replicas = %+v, %v", np, err)
		}
	}

	// No lost update: concurrent status writes on both replicas all land
	// as revisions (the last write wins, none fails).
	var wg2 sync.WaitGroup
	for i := range 10 {
		c := rs[i%2].cli
		wg2.Go(func() {
			st := capi.StatusUp
			if i%2 == 1 {
				st = capi.StatusDown
			}
			if _, err := c.SetPortStatus(ctx, "p1", id, st, ""); err != nil {
				t.Error(err)
			}
		})
	}
	wg2.Wait()
}
