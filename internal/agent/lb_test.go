package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/lbpath"
	"kurma.dev/kurma/pkg/controllerapi"
)

// recLB records what the agent asks of the load-balancer datapath. It
// stands in for lbpath only in these tests of the agent's batching; the
// end-to-end tests use the real one.
type recLB struct {
	applies []lbpath.Changes
	syncs   []lbpath.State
	fail    error
}

func (r *recLB) Apply(_ context.Context, ch lbpath.Changes) error {
	r.applies = append(r.applies, ch)
	return r.fail
}

func (r *recLB) Sync(_ context.Context, s lbpath.State) error {
	r.syncs = append(r.syncs, s)
	return r.fail
}

// namer is a datapath that only names bridges.
type namer struct{ datapath.Interface }

func (namer) BridgeName(vni uint32) string { return "kab" + string(rune('0'+vni%10)) }

func lbAgent(rec *recLB) *Agent {
	return &Agent{cfg: Config{HostID: "h1", LB: rec}, dp: namer{}, log: slog.Default(),
		ports: map[string]*controllerapi.Port{
			"p1": {ID: "p1", VNI: 7, BindingHostID: "h1"},
			"p2": {ID: "p2", VNI: 8, BindingHostID: "h2"},
		},
		gateways: map[uint32]map[string]bool{7: {"10.0.0.1/24": true}},
		lb:       newLBCache()}
}

func testLB(id string, vni uint32, vip string, members ...string) *controllerapi.LoadBalancer {
	l := &controllerapi.LoadBalancer{ID: id, VNI: vni, VIPAddress: vip,
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}}}
	for _, m := range members {
		l.Members = append(l.Members, controllerapi.Member{Address: m})
	}
	return l
}

// TestSyncLBs: the first sync is a full Sync of what this host must
// program (its VPCs' load balancers, its ports' FIPs); then every batch of
// changes is one Apply of only what changed; a failed Apply makes the next
// sync a full one.
func TestSyncLBs(t *testing.T) {
	rec := &recLB{}
	a := lbAgent(rec)
	ctx := t.Context()
	c := &a.lb
	c.lbs["local"] = recOf(testLB("local", 7, "10.96.0.1", "10.0.0.5"))
	c.lbs["onlink"] = recOf(testLB("onlink", 7, "10.0.0.200", "10.0.0.5"))
	c.lbs["remote"] = recOf(testLB("remote", 8, "10.96.0.2", "10.1.0.5")) // no local port in VNI 8
	c.fips["f1"] = &controllerapi.FloatingIP{ID: "f1", FloatingIPAddress: "203.0.113.5", PortID: "p1", FixedIPAddress: "10.0.0.9"}
	c.fips["f2"] = &controllerapi.FloatingIP{ID: "f2", FloatingIPAddress: "203.0.113.6", PortID: "p2", FixedIPAddress: "10.1.0.9"}
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.syncs) != 1 || len(rec.applies) != 0 {
		t.Fatalf("want one full sync first: %d syncs, %d applies", len(rec.syncs), len(rec.applies))
	}
	st := rec.syncs[0]
	if len(st.LBs) != 2 || len(st.FIPs) != 1 || st.FIPs[0].ID != "f1" {
		t.Fatalf("full state: %+v", st)
	}
	for _, l := range st.LBs {
		if l.OnLink != (l.ID == "onlink") || l.Iface != "kab7" {
			t.Errorf("lb %s: on-link %v iface %s", l.ID, l.OnLink, l.Iface)
		}
	}

	// A batch: one member change and one new load balancer -> one Apply
	// with exactly those two.
	c.lbs["local"] = recOf(testLB("local", 7, "10.96.0.1", "10.0.0.5", "10.0.0.6"))
	c.lbs["new"] = recOf(testLB("new", 7, "10.96.0.3", "10.0.0.7"))
	c.dirtyLB["local"], c.dirtyLB["new"] = true, true
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.applies) != 1 || len(rec.applies[0].LBs) != 2 || len(rec.applies[0].DeleteLBs) != 0 {
		t.Fatalf("want one Apply of 2 load balancers: %+v", rec.applies)
	}
	// Nothing dirty: nothing to do.
	if err := a.syncLBs(ctx); err != nil || len(rec.applies) != 1 {
		t.Fatalf("idle sync applied something: %v, %d", err, len(rec.applies))
	}
	// Deleting a programmed one, and one that was never programmed here.
	delete(c.lbs, "local")
	delete(c.lbs, "remote")
	c.dirtyLB["local"], c.dirtyLB["remote"] = true, true
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.applies[1]; len(got.DeleteLBs) != 1 || got.DeleteLBs[0] != "local" || len(got.LBs) != 0 {
		t.Fatalf("delete: %+v", got)
	}
	// The last local port leaves VPC 7: its load balancers go.
	delete(a.ports, "p1")
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.applies[2]; len(got.DeleteLBs) != 2 || len(got.DeleteFIP) != 1 {
		t.Fatalf("vpc left: %+v", got)
	}
	// A failure: the next sync is a full one.
	rec.fail = errors.New("boom")
	a.ports["p1"] = &controllerapi.Port{ID: "p1", VNI: 7, BindingHostID: "h1"}
	if err := a.syncLBs(ctx); err == nil {
		t.Fatal("want the error")
	}
	rec.fail = nil
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if len(rec.syncs) != 2 || len(rec.syncs[1].LBs) != 2 {
		t.Fatalf("after a failure want a full sync of 2: %d syncs %+v", len(rec.syncs), rec.syncs)
	}
}

// FuzzLBSpec: whatever the controller sends, conversion does not panic
// and what it accepts is valid for the datapath.
func FuzzLBSpec(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","vni":7,"vip_address":"10.96.0.1","listeners":[{"protocol":"TCP","port":80,"target_port":8080}],"members":[{"address":"10.0.0.5"}]}`,
		`{"id":"b","vni":7,"vip_address":"10.0.0.9","listeners":[{"protocol":"UDP","port":53}],"session_persistence":{"type":"SOURCE_IP","timeout":0}}`,
		`{"id":"c","vni":7,"vip_address":"fd00::1","listeners":[{"protocol":"SCTP","port":70000}],"members":[{"address":"x","port":-1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var l controllerapi.LoadBalancer
		if json.Unmarshal(b, &l) != nil {
			return
		}
		a := lbAgent(&recLB{})
		a.lb.localVNIs = map[uint32]string{7: ""}
		spec, ok := a.lbSpecLocked(recOf(&l), namer{})
		if ok {
			if err := spec.Validate(); err != nil {
				t.Fatalf("accepted an invalid spec: %v", err)
			}
		}
	})
}
