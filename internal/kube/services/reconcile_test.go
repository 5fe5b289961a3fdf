package services

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// fakeLBController keeps load balancers and floating IPs in memory and
// records every call that changes them.
type fakeLBController struct {
	mu    sync.Mutex
	sns   map[string]capi.Subnet
	lbs   map[string]capi.LoadBalancer
	fips  map[string]capi.FloatingIP
	taken map[string]bool // floating addresses held by others
	calls []string
	next  int
	lists map[string]int // listings by kind: "subnets", "lbs", "fips"
}

func newFakeLBController() *fakeLBController {
	return &fakeLBController{lbs: map[string]capi.LoadBalancer{}, fips: map[string]capi.FloatingIP{}, taken: map[string]bool{},
		lists: map[string]int{},
		sns: map[string]capi.Subnet{"k8s-services": {ID: "k8s-services", NetworkID: "k8s-pods", CIDR: "10.96.0.0/15",
			Purpose: capi.SubnetPurposeService}}}
}

func (f *fakeLBController) record(verb, id string) { f.calls = append(f.calls, verb+" "+id) }

func (f *fakeLBController) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeLBController) GetVPC(context.Context, string, string) (*capi.VPC, error) {
	return &capi.VPC{ID: "k8s-pods", CIDR: testVPC.String()}, nil
}
func (f *fakeLBController) GetSubnet(_ context.Context, _, id string) (*capi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sn, ok := f.sns[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "subnet %s", id)
	}
	return &sn, nil
}
func (f *fakeLBController) CreateSubnet(_ context.Context, _ string, s capi.Subnet) (*capi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sns[s.ID]; ok {
		return nil, kerrors.New(kerrors.Conflict, "subnet %s already exists", s.ID)
	}
	f.sns[s.ID] = s
	f.record("create-subnet", s.ID+" "+s.CIDR)
	return &s, nil
}
func (f *fakeLBController) ListSubnets(_ context.Context, _, vpc string) ([]capi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists["subnets"]++
	var out []capi.Subnet
	for _, sn := range f.sns {
		if sn.NetworkID == vpc {
			out = append(out, sn)
		}
	}
	return out, nil
}

// DeleteSubnet refuses a subnet that holds a load balancer's VIP, as the
// controller does.
func (f *fakeLBController) DeleteSubnet(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sns[id]; !ok {
		return kerrors.New(kerrors.NotFound, "subnet %s", id)
	}
	for _, lb := range f.lbs {
		if lb.VIPSubnetID == id {
			return kerrors.New(kerrors.Conflict, "subnet %s holds load balancer %s", id, lb.ID)
		}
	}
	delete(f.sns, id)
	f.record("delete-subnet", id)
	return nil
}
func (f *fakeLBController) EachLoadBalancer(_ context.Context, _ string, fn func(*capi.LoadBalancer) error) error {
	f.mu.Lock()
	f.lists["lbs"]++
	var all []capi.LoadBalancer
	for _, lb := range f.lbs {
		all = append(all, lb)
	}
	f.mu.Unlock()
	for i := range all {
		if err := fn(&all[i]); err != nil {
			return err
		}
	}
	return nil
}
func (f *fakeLBController) GetLoadBalancer(_ context.Context, _, id string) (*capi.LoadBalancer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb, ok := f.lbs[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "load balancer %s", id)
	}
	return &lb, nil
}
func (f *fakeLBController) CreateLoadBalancer(_ context.Context, _ string, lb capi.LoadBalancer) (*capi.LoadBalancer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.lbs[lb.ID]; ok {
		return nil, kerrors.New(kerrors.Conflict, "load balancer %s already exists", lb.ID)
	}
	// As the controller: the VIP lies in its subnet.
	sn, ok := f.sns[lb.VIPSubnetID]
	if vip, err := netip.ParseAddr(lb.VIPAddress); !ok || err != nil || !netip.MustParsePrefix(sn.CIDR).Contains(vip) {
		return nil, kerrors.New(kerrors.Invalid, "vip %s not in subnet %q", lb.VIPAddress, lb.VIPSubnetID)
	}
	f.lbs[lb.ID] = lb
	f.record("create-lb", lb.ID)
	return &lb, nil
}
func (f *fakeLBController) UpdateLoadBalancer(_ context.Context, _, id string, u capi.LoadBalancerUpdate) (*capi.LoadBalancer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb, ok := f.lbs[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "load balancer %s", id)
	}
	if u.Name != nil {
		lb.Name = *u.Name
	}
	if u.Listeners != nil {
		lb.Listeners = *u.Listeners
	}
	if u.Members != nil {
		lb.Members = *u.Members
	}
	if u.Policy != nil {
		lb.Policy = *u.Policy
	}
	if u.ClearSessionPersistence {
		lb.SessionPersistence = nil
	}
	if u.SessionPersistence != nil {
		lb.SessionPersistence = u.SessionPersistence
	}
	f.lbs[id] = lb
	f.record("update-lb", id)
	return &lb, nil
}
func (f *fakeLBController) SetMembers(_ context.Context, _, id string, m []capi.Member) (*capi.LoadBalancer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb, ok := f.lbs[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "load balancer %s", id)
	}
	lb.Members = m
	f.lbs[id] = lb
	f.record("set-members", id)
	return &lb, nil
}
func (f *fakeLBController) DeleteLoadBalancer(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.lbs[id]; !ok {
		return kerrors.New(kerrors.NotFound, "load balancer %s", id)
	}
	delete(f.lbs, id)
	f.record("delete-lb", id)
	return nil
}
func (f *fakeLBController) GetExternalNetwork(context.Context, string) (*capi.ExternalNetwork, error) {
	return &capi.ExternalNetwork{ID: "public"}, nil
}
func (f *fakeLBController) ListFloatingIPs(context.Context, string) ([]capi.FloatingIP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists["fips"]++
	var out []capi.FloatingIP
	for _, fip := range f.fips {
		out = append(out, fip)
	}
	return out, nil
}
func (f *fakeLBController) GetFloatingIP(_ context.Context, _, id string) (*capi.FloatingIP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fip, ok := f.fips[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "floating ip %s", id)
	}
	return &fip, nil
}
func (f *fakeLBController) CreateFloatingIP(_ context.Context, _ string, fip capi.FloatingIP) (*capi.FloatingIP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.fips[fip.ID]; ok {
		return nil, kerrors.New(kerrors.Conflict, "floating ip %s already exists", fip.ID)
	}
	if fip.FloatingIPAddress == "" {
		f.next++
		fip.FloatingIPAddress = fmt.Sprintf("192.0.2.%d", f.next)
	} else if f.taken[fip.FloatingIPAddress] {
		return nil, kerrors.New(kerrors.Conflict, "address %s is in use", fip.FloatingIPAddress)
	}
	f.fips[fip.ID] = fip
	f.record("create-fip", fip.ID)
	return &fip, nil
}
func (f *fakeLBController) AssociateFloatingIP(_ context.Context, _, id string, a capi.FloatingIPAssociation) (*capi.FloatingIP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fip, ok := f.fips[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "floating ip %s", id)
	}
	fip.LoadBalancerID = a.LoadBalancerID
	f.fips[id] = fip
	f.record("associate-fip", id)
	return &fip, nil
}
func (f *fakeLBController) DeleteFloatingIP(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.fips[id]; !ok {
		return kerrors.New(kerrors.NotFound, "floating ip %s", id)
	}
	delete(f.fips, id)
	f.record("delete-fip", id)
	return nil
}

var _ Controller = (*fakeLBController)(nil)

// syncEnv is a reconciler whose caches the test fills (no informer
// runs), on a fake clientset and a fake controller, set up as the leader
// would be.
type syncEnv struct {
	t    *testing.T
	r    *Reconciler
	kube *fake.Clientset
	fc   *fakeLBController
	ev   *record.FakeRecorder
}

func newSyncEnv(t *testing.T, extOK bool) *syncEnv {
	t.Helper()
	kube := fake.NewClientset()
	fc := newFakeLBController()
	r, err := New(Config{Kube: kube, Controller: fc, ServiceCIDR: testSvcCIDR,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.q.ShutDown)
	ev := record.NewFakeRecorder(100)
	r.rec = ev
	r.vpcPrefix, r.extOK = testVPC, extOK
	return &syncEnv{t: t, r: r, kube: kube, fc: fc, ev: ev}
}

// putService stores s in the cache and the fake clientset.
func (e *syncEnv) putService(s *corev1.Service) {
	e.t.Helper()
	o, _ := compactService(s)
	if err := e.r.svcIdx.Update(o); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("services"), s.Namespace, s.Name); err == nil {
		err = e.kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("services"), s, s.Namespace)
		if err != nil {
			e.t.Fatal(err)
		}
	} else if err := e.kube.Tracker().Add(s); err != nil {
		e.t.Fatal(err)
	}
}

// refresh reads ns/web back from the fake API server into the cache, as
// the informer would after a status patch.
func (e *syncEnv) refresh() {
	e.t.Helper()
	s, err := e.kube.CoreV1().Services("ns").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	o, _ := compactService(s)
	if err := e.r.svcIdx.Update(o); err != nil {
		e.t.Fatal(err)
	}
}

func (e *syncEnv) deleteService(s *corev1.Service) {
	e.t.Helper()
	o, _ := compactService(s)
	if err := e.r.svcIdx.Delete(o); err != nil {
		e.t.Fatal(err)
	}
}

// putSlice stores a slice of Service "web" in the cache as its handler
// would.
func (e *syncEnv) putSlice(s *discoveryv1.EndpointSlice) {
	e.t.Helper()
	s.Labels = map[string]string{discoveryv1.LabelServiceName: "web"}
	o, _ := compactSlice(s)
	old, _, _ := e.r.sliceIdx.Get(o)
	if err := e.r.sliceIdx.Update(o); err != nil {
		e.t.Fatal(err)
	}
	oldObj, _ := old.(*sliceObj)
	e.r.sliceMoved(oldObj, o.(*sliceObj))
}

// sync syncs ns/web and returns the controller calls and the API
// actions (verb, subresource) it made.
func (e *syncEnv) sync() (calls, actions []string) {
	e.t.Helper()
	e.kube.ClearActions()
	if err := e.r.sync(context.Background(), "ns/web"); err != nil {
		e.t.Fatalf("sync: %v", err)
	}
	for _, a := range e.kube.Actions() {
		actions = append(actions, a.GetVerb()+" "+a.GetResource().Resource+"/"+a.GetSubresource())
	}
	return e.fc.takeCalls(), actions
}

func (e *syncEnv) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.ev.Events:
			out = append(out, strings.Fields(ev)[1])
		default:
			return out
		}
	}
}

func lbService(ip string) *corev1.Service {
	s := svcOf("10.96.0.10", sp("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.LoadBalancerIP = ip
	return s
}

// TestSyncClusterIP walks one ClusterIP Service through its life and
// checks that each sync sends the smallest change: a create, nothing, a
// member replacement, an update, a delete; a ClusterIP Service's status
// is never written.
func TestSyncClusterIP(t *testing.T) {
	e := newSyncEnv(t, true)
	id := LBID("u1")
	svc := svcOf("10.96.0.10", sp("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	two := slice("web-1", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080},
		ep{addr: "10.32.0.5"}, ep{addr: "10.32.0.6"})
	three := two.DeepCopy()
	three.Endpoints = append(three.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.32.0.7"}})
	withPort := svc.DeepCopy()
	withPort.Spec.Ports = append(withPort.Spec.Ports, sp("dns", corev1.ProtocolUDP, 53, intstr.FromInt32(53)))
	headless := svc.DeepCopy()
	headless.Spec.ClusterIP, headless.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	for _, st := range []struct {
		name  string
		do    func()
		calls []string
	}{
		{"service and slice appear", func() { e.putService(svc); e.putSlice(two) }, []string{"create-lb " + id}},
		{"nothing changed", func() {}, nil},
		{"an endpoint more", func() { e.putSlice(three) }, []string{"set-members " + id}},
		{"a port more", func() { e.putService(withPort) }, []string{"update-lb " + id}},
		{"headless now", func() { e.putService(headless) }, []string{"delete-lb " + id}},
		{"headless again", func() {}, nil},
		{"back, then deleted", func() { e.putService(svc); e.sync(); e.deleteService(svc) }, []string{"delete-lb " + id}},
	} {
		st.do()
		calls, actions := e.sync()
		if !slices.Equal(calls, st.calls) || len(actions) != 0 {
			t.Fatalf("%s: controller calls %q, API actions %q; want %q and none", st.name, calls, actions, st.calls)
		}
	}
	if lb, ok := e.fc.lbs[id]; ok {
		t.Fatalf("load balancer left: %+v", lb)
	}
}

// statusPatch decodes the status patch of the last sync's actions.
func statusPatch(t *testing.T, kube *fake.Clientset) (ingress []string, cond *metav1.Condition) {
	t.Helper()
	for _, a := range kube.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || p.GetSubresource() != "status" {
			continue
		}
		var body struct {
			Status struct {
				LoadBalancer struct {
					Ingress []corev1.LoadBalancerIngress `json:"ingress"`
				} `json:"loadBalancer"`
				Conditions []metav1.Condition `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			t.Fatal(err)
		}
		for _, in := range body.Status.LoadBalancer.Ingress {
			ingress = append(ingress, in.IP)
		}
		if len(body.Status.Conditions) == 1 {
			cond = &body.Status.Conditions[0]
		}
		return ingress, cond
	}
	t.Fatal("no status patch")
	return nil, nil
}

// TestSyncLoadBalancer: a LoadBalancer Service gets a floating IP and
// its status; a requested address that is taken gives an Event and a
// False condition and is remembered until the Service goes; without the
// external network the Service is told once.
func TestSyncLoadBalancer(t *testing.T) {
	id := LBID("u1")
	t.Run("allocated", func(t *testing.T) {
		e := newSyncEnv(t, true)
		e.putService(lbService(""))
		calls, actions := e.sync()
		if !slices.Equal(calls, []string{"create-lb " + id, "create-fip " + id}) ||
			!slices.Equal(actions, []string{"patch services/status"}) {
			t.Fatalf("calls %q, actions %q", calls, actions)
		}
		ingress, cond := statusPatch(t, e.kube)
		if !slices.Equal(ingress, []string{"192.0.2.1"}) || cond == nil || cond.Status != metav1.ConditionTrue {
			t.Fatalf("status ingress %v, condition %+v", ingress, cond)
		}
		if evs := e.events(); len(evs) != 0 {
			t.Fatalf("events %v", evs)
		}
		e.deleteService(lbService(""))
		if calls, _ := e.sync(); !slices.Equal(calls, []string{"delete-fip " + id, "delete-lb " + id}) {
			t.Fatalf("delete: calls %q", calls)
		}
	})
	t.Run("address taken", func(t *testing.T) {
		e := newSyncEnv(t, true)
		e.fc.taken["192.0.2.50"] = true
		e.putService(lbService("192.0.2.50"))
		calls, _ := e.sync()
		if !slices.Equal(calls, []string{"create-lb " + id}) {
			t.Fatalf("calls %q", calls)
		}
		if _, cond := statusPatch(t, e.kube); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonAddressTaken {
			t.Fatalf("condition %+v", cond)
		}
		if evs := e.events(); !slices.Equal(evs, []string{ReasonAddressTaken}) {
			t.Fatalf("events %v", evs)
		}
		if a, _ := e.r.Waiting(); a != 1 {
			t.Fatalf("%d addresses waited for, want 1", a)
		}
		e.deleteService(lbService(""))
		e.sync()
		if a, w := e.r.Waiting(); a != 0 || w != 0 {
			t.Fatalf("after the Service went: %d addresses, %d warned; want 0, 0", a, w)
		}
	})
	t.Run("no external network", func(t *testing.T) {
		e := newSyncEnv(t, false)
		e.putService(lbService(""))
		calls, _ := e.sync()
		if !slices.Equal(calls, []string{"create-lb " + id}) {
			t.Fatalf("calls %q", calls)
		}
		if _, cond := statusPatch(t, e.kube); cond == nil || cond.Reason != ReasonNoExternal {
			t.Fatalf("condition %+v", cond)
		}
		e.sync()
		if evs := e.events(); !slices.Equal(evs, []string{ReasonNoExternal}) {
			t.Fatalf("events %v, want one %s", evs, ReasonNoExternal)
		}
		e.deleteService(lbService(""))
		e.sync()
		if _, w := e.r.Waiting(); w != 0 {
			t.Fatalf("%d Services still warned after they went", w)
		}
	})
}

// TestResyncCollects: a resync deletes the load balancers and floating
// IPs of Services that are gone, keeps the others and queues every
// Service.
func TestResyncCollects(t *testing.T) {
	e := newSyncEnv(t, true)
	e.putService(lbService(""))
	e.sync()
	e.refresh()
	e.fc.lbs[LBID("gone")] = capi.LoadBalancer{ID: LBID("gone"), VIPAddress: "10.96.0.99"}
	e.fc.fips[LBID("gone")] = capi.FloatingIP{ID: LBID("gone"), FloatingIPAddress: "192.0.2.99"}
	e.fc.lbs["not-ours"] = capi.LoadBalancer{ID: "not-ours"}
	if err := e.r.resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := e.fc.takeCalls()
	slices.Sort(calls)
	if want := []string{"delete-fip " + LBID("gone"), "delete-lb " + LBID("gone")}; !slices.Equal(calls, want) {
		t.Fatalf("resync calls %q, want %q", calls, want)
	}
	if k, _ := e.r.q.Get(); k != "ns/web" {
		t.Fatalf("queued %q, want ns/web", k)
	}
	// The caches were refilled from the listing: the next sync writes nothing.
	if calls, actions := e.sync(); len(calls) != 0 || len(actions) != 0 {
		t.Fatalf("sync after resync: %q, %q", calls, actions)
	}
}

// TestServiceCIDR: a clusterIP from a ServiceCIDR added to the cluster
// (outside the configured range) is served once its range has a service
// subnet, with its load balancer's VIP in that subnet; the resync keeps
// that load balancer; the subnet goes with the ServiceCIDR, and an orphan
// subnet (its ServiceCIDR deleted while no watcher ran) goes at resync.
func TestServiceCIDR(t *testing.T) {
	e := newSyncEnv(t, true)
	ctx := t.Context()
	svc := svcOf("203.0.113.10", sp("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	e.putService(svc)
	e.putSlice(slice("web-1", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080}, ep{addr: "10.32.0.5"}))
	if calls, _ := e.sync(); len(calls) != 0 {
		t.Fatalf("clusterIP outside every known range: calls %v, want none", calls)
	}
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"203.0.113.0/24"}}}
	// The default ServiceCIDR mirrors the configured range: no subnet.
	def := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{testSvcCIDR.String()}}}
	for _, o := range []*networkingv1.ServiceCIDR{sc, def} {
		if err := e.r.cidrInf.GetStore().Add(o); err != nil {
			t.Fatal(err)
		}
		if err := e.r.syncCIDR(ctx, o.Name); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := e.fc.takeCalls(), []string{"create-subnet k8s-servicecidr-extra 203.0.112.0/23"}; !slices.Equal(got, want) {
		t.Fatalf("ServiceCIDRs added: calls %v, want %v", got, want)
	}
	if calls, _ := e.sync(); !slices.Equal(calls, []string{"create-lb " + LBID("u1")}) {
		t.Fatalf("after the range was served: calls %v, want the load balancer", calls)
	}
	if sn := e.fc.lbs[LBID("u1")].VIPSubnetID; sn != "k8s-servicecidr-extra" {
		t.Fatalf("load balancer in subnet %q, want k8s-servicecidr-extra", sn)
	}
	if err := e.r.resync(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := e.fc.takeCalls(); len(calls) != 0 {
		t.Fatalf("resync: calls %v, want none (the load balancer is wanted)", calls)
	}
	// The Service goes, then the ServiceCIDR (the API server's order).
	e.deleteService(svc)
	if calls, _ := e.sync(); !slices.Equal(calls, []string{"delete-lb " + LBID("u1")}) {
		t.Fatalf("Service deleted: calls %v", calls)
	}
	if err := e.r.cidrInf.GetStore().Delete(sc); err != nil {
		t.Fatal(err)
	}
	if err := e.r.syncCIDR(ctx, "extra"); err != nil {
		t.Fatal(err)
	}
	if got, want := e.fc.takeCalls(), []string{"delete-subnet k8s-servicecidr-extra"}; !slices.Equal(got, want) {
		t.Fatalf("ServiceCIDR deleted: calls %v, want %v", got, want)
	}
	if e.r.ranges().Contains(netip.MustParseAddr("203.0.113.10")) {
		t.Fatal("the deleted ServiceCIDR's range is still served")
	}
	// An orphan: its ServiceCIDR went while no watcher ran.
	e.fc.sns["k8s-servicecidr-gone"] = capi.Subnet{ID: "k8s-servicecidr-gone", NetworkID: "k8s-pods",
		CIDR: "198.51.100.0/24", Purpose: capi.SubnetPurposeService}
	if err := e.r.resync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := e.fc.takeCalls(), []string{"delete-subnet k8s-servicecidr-gone"}; !slices.Equal(got, want) {
		t.Fatalf("resync with an orphan subnet: calls %v, want %v", got, want)
	}
}

// TestResyncListsOnce: a resync lists subnets, load balancers and
// floating IPs once each, whatever the number of Services and
// ServiceCIDRs (no listing per Service, namespace or range).
func TestResyncListsOnce(t *testing.T) {
	e := newSyncEnv(t, true)
	ctx := t.Context()
	for i := range 3 {
		sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("extra%d", i)},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{fmt.Sprintf("198.51.%d.0/24", 100+i)}}}
		if err := e.r.cidrInf.GetStore().Add(sc); err != nil {
			t.Fatal(err)
		}
		if err := e.r.syncCIDR(ctx, sc.Name); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		s := svcOf(fmt.Sprintf("10.96.1.%d", i), sp("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		s.Namespace, s.Name, s.UID = fmt.Sprintf("ns%d", i%10), fmt.Sprintf("web%d", i), types.UID(fmt.Sprintf("u%d", i))
		e.putService(s)
	}
	e.fc.mu.Lock()
	clear(e.fc.lists)
	e.fc.mu.Unlock()
	if err := e.r.resync(ctx); err != nil {
		t.Fatal(err)
	}
	e.fc.mu.Lock()
	defer e.fc.mu.Unlock()
	if want := map[string]int{"subnets": 1, "lbs": 1, "fips": 1}; fmt.Sprint(e.fc.lists) != fmt.Sprint(want) {
		t.Fatalf("a resync of 40 Services in 10 namespaces and 3 ServiceCIDRs listed %v, want %v", e.fc.lists, want)
	}
}
