package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
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
	a := &Agent{cfg: Config{HostID: "h1", LB: rec}, dp: namer{}, log: slog.Default(), hc: newHealthChecks("127.0.0.1", slog.Default()),
		ports: newPortCache("h1"), vpcs: newVPCState(), lb: newLBCache()}
	a.ports.ports["p1"] = &controllerapi.Port{ID: "p1", VNI: 7, BindingHostID: "h1",
		FixedIPs: []controllerapi.FixedIP{{IPAddress: "10.0.0.5", CIDR: "10.0.0.0/24", GatewayIP: "10.0.0.1"}}}
	a.ports.ports["p2"] = &controllerapi.Port{ID: "p2", VNI: 8, BindingHostID: "h2"}
	a.vpcs.gateways[7] = map[string]bool{"10.0.0.1/24": true}
	return a
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
	c := a.lb
	c.lbs["local"] = recOf(testLB("local", 7, "10.96.0.1", "10.0.0.5"), "h1")
	c.lbs["onlink"] = recOf(testLB("onlink", 7, "10.0.0.200", "10.0.0.5"), "h1")
	c.lbs["remote"] = recOf(testLB("remote", 8, "10.96.0.2", "10.1.0.5"), "h1") // no local port in VNI 8
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
	c.lbs["local"] = recOf(testLB("local", 7, "10.96.0.1", "10.0.0.5", "10.0.0.6"), "h1")
	c.lbs["new"] = recOf(testLB("new", 7, "10.96.0.3", "10.0.0.7"), "h1")
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
	delete(a.ports.ports, "p1")
	if err := a.syncLBs(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.applies[2]; len(got.DeleteLBs) != 2 || len(got.DeleteFIP) != 1 {
		t.Fatalf("vpc left: %+v", got)
	}
	// A failure: the next sync is a full one.
	rec.fail = errors.New("boom")
	a.ports.ports["p1"] = &controllerapi.Port{ID: "p1", VNI: 7, BindingHostID: "h1"}
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

// TestLBHostLevel: a load balancer with host-level frontends is
// programmed by a host without a port in its VPC (no bridge frontend
// then), and its members carry what the datapath selects by.
func TestLBHostLevel(t *testing.T) {
	a := lbAgent(&recLB{})
	a.lb.localVNIs = map[uint32]string{7: ""}
	l := testLB("np", 8, "10.96.0.9", "10.1.0.5")
	l.Listeners[0].NodePort = 30080
	l.Listeners = append(l.Listeners, controllerapi.Listener{Protocol: "UDP", Port: 53})
	l.Members = []controllerapi.Member{
		{Address: "10.1.0.5", HostID: "h1", Listeners: []string{"TCP/80"}},
		{Address: "10.1.0.6", HostID: "h2", Backup: true},
		{Address: "10.1.0.7", Listeners: []string{"SCTP/9"}}, // serves no listener: left out
	}
	l.ExternalLocal, l.ExternalAddresses = true, []string{"192.0.2.1"}
	spec, ok := a.lbSpecLocked(recOf(l, "h1"), namer{})
	if !ok {
		t.Fatal("a load balancer with a node port must be programmed everywhere")
	}
	if spec.Iface != "" || !spec.ExternalLocal || len(spec.External) != 1 || spec.Listeners[0].NodePort != 30080 {
		t.Fatalf("spec %+v", spec)
	}
	want := []lbpath.Member{
		{Addr: netip.MustParseAddr("10.1.0.5"), Serves: []lbpath.ListenerKey{{Proto: lbpath.TCP, Port: 80}}, Local: true},
		{Addr: netip.MustParseAddr("10.1.0.6"), Backup: true},
	}
	if !reflect.DeepEqual(spec.Members, want) {
		t.Fatalf("members %+v, want %+v", spec.Members, want)
	}
	l.ExternalAddresses, l.Listeners[0].NodePort = nil, 0
	if _, ok := a.lbSpecLocked(recOf(l, "h1"), namer{}); ok {
		t.Fatal("without host-level frontends only hosts with a port in its VPC program it")
	}
	l.HostAccess = true
	if spec, ok := a.lbSpecLocked(recOf(l, "h1"), namer{}); !ok || !spec.HostAccess {
		t.Fatalf("host access: programmed %v, %+v", ok, spec)
	}
}

// FuzzLBSpec: whatever the controller sends, conversion does not panic
// and what it accepts is valid for the datapath.
func FuzzLBSpec(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","vni":7,"vip_address":"10.96.0.1","listeners":[{"protocol":"TCP","port":80,"target_port":8080}],"members":[{"address":"10.0.0.5"}]}`,
		`{"id":"b","vni":7,"vip_address":"10.0.0.9","listeners":[{"protocol":"UDP","port":53}],"session_persistence":{"type":"SOURCE_IP","timeout":0}}`,
		`{"id":"c","vni":7,"vip_address":"fd00::1","listeners":[{"protocol":"SCTP","port":70000}],"members":[{"address":"x","port":-1}]}`,
		`{"id":"d","vni":9,"vip_address":"10.96.0.4","host_access":true,"external_addresses":["192.0.2.1","x"],"external_local":true,` +
			`"listeners":[{"protocol":"TCP","port":80,"node_port":30080},{"protocol":"UDP","port":80,"node_port":30080}],` +
			`"members":[{"address":"10.0.0.5","port":8080,"listeners":["TCP/80","UDP/81"],"host_id":"h1","backup":true},{"address":"192.0.2.7","external":true}]}`,
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
		spec, ok := a.lbSpecLocked(recOf(&l, "h1"), namer{})
		if ok {
			if err := spec.Validate(); err != nil {
				t.Fatalf("accepted an invalid spec: %v", err)
			}
		}
	})
}

// TestHealthCheckNodePort: a load balancer with ExternalLocal and a
// health check port gets an HTTP listener that answers 200 with its
// local member count, 503 without local members, and goes with it.
func TestHealthCheckNodePort(t *testing.T) {
	a := lbAgent(&recLB{})
	a.hc = newHealthChecks("127.0.0.1", slog.Default())
	t.Cleanup(func() { a.hc.close(context.Background()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	l := testLB("hc", 7, "10.96.0.9", "10.0.0.5")
	l.Name, l.ExternalLocal, l.HealthCheckNodePort = "ns/web", true, port
	l.Members[0].HostID = "h1"
	get := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/healthz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sync := func() {
		t.Helper()
		a.lb.lbs["hc"] = recOf(l, "h1")
		a.lb.dirtyLB["hc"] = true
		if err := a.syncLBs(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if code, body := get(); code != 200 || !strings.Contains(body, `"localEndpoints":1`) || !strings.Contains(body, `"name":"web"`) {
		t.Fatalf("with a local member: %d %s", code, body)
	}
	l.Members[0].HostID = "h2"
	sync()
	if code, body := get(); code != 503 || !strings.Contains(body, `"localEndpoints":0`) {
		t.Fatalf("without a local member: %d %s", code, body)
	}
	delete(a.lb.lbs, "hc")
	a.lb.dirtyLB["hc"] = true
	if err := a.syncLBs(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code, body := get(); code != 0 {
		t.Fatalf("after the load balancer went: %d %s, want no listener", code, body)
	}
}

// TestLimitsAgree: the datapath takes every member the controller's
// contract allows (lbpath cannot import controllerapi, so it keeps its
// own copy of the limit).
func TestLimitsAgree(t *testing.T) {
	if lbpath.MaxMembers != controllerapi.MaxMembers {
		t.Fatalf("lbpath.MaxMembers %d, controllerapi.MaxMembers %d", lbpath.MaxMembers, controllerapi.MaxMembers)
	}
}
