package services

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/pkg/controllerapi"
)

// TestCompactRecords checks that the cached records give the reconciler
// what the full objects would: the same desired load balancer, the same
// floating IP decision and status, the same store keys; and that the
// transforms pass records through (they may run twice).
func TestCompactRecords(t *testing.T) {
	full := func() (*corev1.Service, []*discoveryv1.EndpointSlice) {
		s := svcOf("10.96.0.40", sp("http", "", 80, intstr.FromString("web")), sp("dns", corev1.ProtocolUDP, 53, intstr.FromInt32(5353)))
		s.ResourceVersion, s.Generation = "42", 3
		s.Labels = map[string]string{"app": "web"}
		s.Annotations = map[string]string{"a": "b"}
		s.Spec.Selector = map[string]string{"app": "web"}
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass, s.Spec.LoadBalancerIP = new(DefaultClass), "198.51.100.7"
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(60))}}
		s.Spec.ClusterIPs = []string{"10.96.0.40", "fd00:96::40"}
		s.Spec.ExternalIPs = []string{"192.0.2.1"}
		s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = corev1.ServiceExternalTrafficPolicyLocal, 31000
		s.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyLocal)
		s.Spec.Ports[0].NodePort, s.Spec.Ports[0].AppProtocol = 30080, new("http")
		vip := corev1.LoadBalancerIPModeVIP
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7", IPMode: &vip}}
		s.Status.Conditions = []metav1.Condition{{Type: ConditionFloatingIP, Status: metav1.ConditionTrue, Reason: ReasonAllocated}}
		a := slice("web-a", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8080},
			ep{addr: "10.32.0.9"}, ep{addr: "10.32.0.2", ready: new(false)}, ep{addr: "10.32.0.5", ready: new(true)},
			ep{addr: "10.32.0.6", terminating: true, node: "n2"})
		a.Labels = map[string]string{discoveryv1.LabelServiceName: "web", "other": "x"}
		a.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p", UID: "pod-uid"}
		a.Endpoints[0].Addresses = append(a.Endpoints[0].Addresses, "10.32.0.99")
		a.Endpoints[2].NodeName, a.Endpoints[2].Zone = new("n1"), new("z")
		b := slice("web-b", discoveryv1.AddressTypeIPv4, map[string]int32{"http": 8081}, ep{addr: "10.32.0.7"})
		b.Labels = map[string]string{discoveryv1.LabelServiceName: "web"}
		return s, []*discoveryv1.EndpointSlice{a, b}
	}
	s, sls := full()
	o, err := compactService(s)
	if err != nil {
		t.Fatal(err)
	}
	so := o.(*svcObj)
	if again, _ := compactService(so); again != so {
		t.Fatal("the Service transform changed a record")
	}
	// The labels that hand a Service to another proxy survive the
	// transform (and take it from us); others do not.
	if so.proxyLabels != nil {
		t.Fatalf("labels kept: %v", so.proxyLabels)
	}
	for _, l := range []string{LabelServiceProxyName, LabelHeadless} {
		ls, _ := full()
		ls.Labels = map[string]string{"app": "web", l: "foo-bar"}
		lo, _ := compactService(ls)
		if got := lo.(*svcObj).service().Labels; len(got) != 1 || got[l] != "foo-bar" {
			t.Fatalf("%s: labels after the transform %v", l, got)
		}
		if w := desired(lo.(*svcObj).service(), nil, netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.32.0.0/16"), nil); w != nil {
			t.Fatalf("%s: a Service with the label is served: %+v", l, w)
		}
	}
	for _, l := range []string{LabelServiceProxyName, LabelHeadless} {
		_, lsl := full()
		lsl[0].Labels[l] = ""
		if o, _ := compactSlice(lsl[0]); o.(*sliceObj).service != "" {
			t.Fatalf("%s: a labelled slice still belongs to %q", l, o.(*sliceObj).service)
		}
	}
	if k, err := cache.MetaNamespaceKeyFunc(so); err != nil || k != "ns/web" {
		t.Fatalf("store key %q, %v; want ns/web", k, err)
	}
	var rebuilt []*discoveryv1.EndpointSlice
	for _, sl := range sls {
		o, err := compactSlice(sl)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := compactSlice(o); again != o {
			t.Fatal("the slice transform changed a record")
		}
		if o.(*sliceObj).service != "web" {
			t.Fatalf("slice %s: service %q, want web", sl.Name, o.(*sliceObj).service)
		}
		rebuilt = append(rebuilt, o.(*sliceObj).slice())
	}
	s, sls = full() // the transforms may have changed the decoded objects
	got := desired(so.service(), rebuilt, testSvcCIDR, testVPC, nil)
	want := desired(s, sls, testSvcCIDR, testVPC, nil)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("desired from records:\n%+v\nfrom objects:\n%+v", got, want)
	}
	if len(want.Members) != 4 || want.Members[3].PortID != "pod-pod-uid" || !want.Members[1].Backup ||
		want.Members[1].HostID != "n2" || want.Persistence == nil || !want.Policy.ExternalLocal || !want.Policy.InternalLocal ||
		want.Policy.HealthCheckNodePort == 0 || len(want.Policy.ExternalAddresses) != 1 || want.Listeners[0].NodePort == 0 {
		t.Fatalf("the fixture does not exercise members, targets and affinity: %+v", want)
	}
	r := &Reconciler{cfg: Config{Class: DefaultClass, ServiceCIDR: testSvcCIDR}}
	rs := so.service()
	if !r.wantsFIP(rs) || !r.ours(rs) || rs.Spec.LoadBalancerIP != s.Spec.LoadBalancerIP ||
		!reflect.DeepEqual(rs.Status, s.Status) || rs.Generation != 3 || rs.UID != s.UID || rs.ResourceVersion != "42" {
		t.Fatalf("rebuilt Service %+v lacks what sync reads of %+v", rs, s)
	}
}

// TestSliceMoved: the Service -> slices map follows adds, relabels and
// deletes, and each change enqueues the Services it touches.
func TestSliceMoved(t *testing.T) {
	r, err := New(Config{Kube: fake.NewClientset(), Controller: (*controllerapi.Client)(nil),
		ServiceCIDR: testSvcCIDR})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.q.ShutDown)
	sl := func(name, svc string) *sliceObj {
		return &sliceObj{objMeta: objMeta{ns: "ns", name: name}, service: svc}
	}
	steps := []struct {
		old, cur *sliceObj
		want     map[string][]string
	}{
		{nil, sl("a", "one"), map[string][]string{"ns/one": {"ns/a"}}},
		{sl("a", "one"), sl("a", "one"), map[string][]string{"ns/one": {"ns/a"}}},
		{nil, sl("b", "one"), map[string][]string{"ns/one": {"ns/a", "ns/b"}}},
		{sl("a", "one"), sl("a", "two"), map[string][]string{"ns/one": {"ns/b"}, "ns/two": {"ns/a"}}},
		{sl("b", "one"), sl("b", ""), map[string][]string{"ns/two": {"ns/a"}}},
		{sl("a", "two"), nil, map[string][]string{}},
	}
	for i, st := range steps {
		r.sliceMoved(st.old, st.cur)
		if !reflect.DeepEqual(r.slicesBy, st.want) {
			t.Fatalf("step %d: %v, want %v", i, r.slicesBy, st.want)
		}
	}
	// Every step enqueued (after the coalescing window) what it touched.
	want := map[string]bool{"ns/one": true, "ns/two": true}
	for len(want) > 0 {
		k, _ := r.q.Get()
		delete(want, k)
		r.q.Done(k)
	}
}
