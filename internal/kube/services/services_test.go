package services_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/services"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// TestClusterIP: Services and EndpointSlices on a real API server become
// load balancers in a real controller: VIP = clusterIP, a listener per
// port with named target ports resolved, ready endpoints as members,
// ClientIP affinity, updates, headless Services, deletes.
func TestClusterIP(t *testing.T) {
	e := start(t, true)
	e.reconciler(time.Minute)
	e.namespace("web")

	// The API server's own Service takes the range's first host, which
	// must be requestable (the service subnet's gateway lies outside).
	k := e.getSvc("default", "kubernetes")
	e.waitLB(k, "the kubernetes Service's load balancer", func(lb *capi.LoadBalancer) error {
		if lb.VIPAddress != k.Spec.ClusterIP {
			return fmt.Errorf("vip %s, want %s", lb.VIPAddress, k.Spec.ClusterIP)
		}
		return nil
	})

	s := e.createSvc(svc("web", "front",
		tcp("http", 80, intstr.FromString("web")), udp("dns", 53, intstr.FromInt32(5353))))
	lb := e.waitLB(s, "empty load balancer", func(lb *capi.LoadBalancer) error { return nil })
	wantL := []capi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 80}, {Protocol: "UDP", Port: 53, TargetPort: 5353}}
	if lb.VIPAddress != s.Spec.ClusterIP || lb.VIPSubnetID != "k8s-services" || lb.Name != "web/front" ||
		len(lb.Members) != 0 || !sameListeners(lb.Listeners, wantL) {
		t.Fatalf("load balancer %+v: want vip %s, listeners %+v, no members", lb, s.Spec.ClusterIP, wantL)
	}

	ep := discoveryPorts{{"http", corev1.ProtocolTCP, 8080}, {"dns", corev1.ProtocolUDP, 5353}}
	e.applySlice(endpoints("web", "front-a", "front", ep.slice(), "10.32.0.5", "10.32.0.6", "!10.32.0.7"))
	e.applySlice(endpoints("web", "front-b", "front", ep.slice(), "10.32.0.8"))
	lb = e.waitLB(s, "members from two slices", func(lb *capi.LoadBalancer) error {
		if got, want := addrs(lb), []string{"10.32.0.5", "10.32.0.6", "10.32.0.8"}; !slices.Equal(got, want) {
			return fmt.Errorf("members %v, want %v", got, want)
		}
		return nil
	})
	wantL[0].TargetPort = 8080
	if !sameListeners(lb.Listeners, wantL) {
		t.Fatalf("listeners %+v, want %+v (named target resolved)", lb.Listeners, wantL)
	}
	rev := lb.RevisionNumber

	// One endpoint replaced: one member replacement, only this LB.
	other := e.createSvc(svc("web", "other", tcp("", 81, intstr.FromInt32(81))))
	otherLB := e.waitLB(other, "other's load balancer", func(*capi.LoadBalancer) error { return nil })
	e.applySlice(endpoints("web", "front-b", "front", ep.slice(), "10.32.0.9"))
	lb = e.waitLB(s, "endpoint replaced", func(lb *capi.LoadBalancer) error {
		if got, want := addrs(lb), []string{"10.32.0.5", "10.32.0.6", "10.32.0.9"}; !slices.Equal(got, want) {
			return fmt.Errorf("members %v, want %v", got, want)
		}
		return nil
	})
	if lb.RevisionNumber <= rev {
		t.Fatalf("revision %d after update, was %d", lb.RevisionNumber, rev)
	}
	if o, err := e.lbOf(other); err != nil || o.RevisionNumber != otherLB.RevisionNumber {
		t.Fatalf("another Service's load balancer changed: %+v %v (revision was %d)", o, err, otherLB.RevisionNumber)
	}

	// Session affinity.
	cur := e.getSvc("web", "front")
	cur.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	cur.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: new(int32(77))}}
	if _, err := e.c.Client.CoreV1().Services("web").Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLB(s, "source-IP persistence", func(lb *capi.LoadBalancer) error {
		if p := lb.SessionPersistence; p == nil || p.Type != capi.PersistenceSourceIP || p.Timeout != 77 {
			return fmt.Errorf("persistence %+v", p)
		}
		return nil
	})

	// Headless: no load balancer.
	h := svc("web", "headless", tcp("", 80, intstr.FromInt32(80)))
	h.Spec.ClusterIP = corev1.ClusterIPNone
	h = e.createSvc(h)
	e.applySlice(endpoints("web", "headless-a", "headless", nil, "10.32.0.5"))

	// Selector-less Service whose slices another party manages, with an
	// address outside the VPC (e.g. a node), an external member.
	m := e.createSvc(svc("web", "manual", tcp("", 443, intstr.FromInt32(8443))))
	e.applySlice(endpoints("web", "manual-x", "manual", []discoveryv1.EndpointPort{eport("", corev1.ProtocolTCP, 8443)}, "10.33.1.1", "172.16.0.1"))
	e.waitLB(m, "selector-less members", func(lb *capi.LoadBalancer) error {
		if got := addrs(lb); !slices.Equal(got, []string{"10.33.1.1", "172.16.0.1"}) {
			return fmt.Errorf("members %v", got)
		}
		if lb.Members[0].External || !lb.Members[1].External || !lb.HostAccess {
			return fmt.Errorf("members %+v, host access %v: want the node address external", lb.Members, lb.HostAccess)
		}
		return nil
	})
	if _, err := e.lbOf(h); err == nil {
		t.Fatal("headless Service got a load balancer")
	}

	// Delete: the load balancer goes; other Services keep theirs.
	e.deleteSvc("web", "front")
	e.waitNoLB(s, "deleted Service's load balancer gone")
	if _, err := e.lbOf(other); err != nil {
		t.Fatalf("other Service lost its load balancer: %v", err)
	}
}

type discoveryPort struct {
	name  string
	proto corev1.Protocol
	port  int32
}

type discoveryPorts []discoveryPort

func (ps discoveryPorts) slice() []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for _, p := range ps {
		out = append(out, eport(p.name, p.proto, p.port))
	}
	return out
}

func sameListeners(a, b []capi.Listener) bool {
	norm := func(ls []capi.Listener) []capi.Listener {
		out := slices.Clone(ls)
		for i := range out {
			if out[i].TargetPort == 0 {
				out[i].TargetPort = out[i].Port
			}
		}
		slices.SortFunc(out, func(x, y capi.Listener) int {
			if x.Protocol != y.Protocol {
				if x.Protocol < y.Protocol {
					return -1
				}
				return 1
			}
			return x.Port - y.Port
		})
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func lbSvc(ns, name, ip string) *corev1.Service {
	s := svc(ns, name, tcp("", 80, intstr.FromInt32(8080)))
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.LoadBalancerIP = ip
	return s
}

func ingressIP(s *corev1.Service) string {
	if in := s.Status.LoadBalancer.Ingress; len(in) == 1 && in[0].IPMode != nil && *in[0].IPMode == corev1.LoadBalancerIPModeVIP {
		return in[0].IP
	}
	return ""
}

// TestLoadBalancer: floating IPs for type LoadBalancer, status with
// ipMode VIP, loadBalancerIP honored and a taken one reported, classes
// respected, release on type change and delete.
func TestLoadBalancer(t *testing.T) {
	e := start(t, true)
	e.reconciler(time.Minute)
	e.namespace("lb")

	a := e.createSvc(lbSvc("lb", "a", ""))
	var ip string
	e.eventually(15*time.Second, "ingress of a", func() error {
		if ip = ingressIP(e.getSvc("lb", "a")); ip == "" {
			return fmt.Errorf("no ingress")
		}
		return nil
	})
	f, err := e.ctl.GetFloatingIP(context.Background(), project, services.LBID(a.UID))
	if err != nil || f.FloatingIPAddress != ip || f.LoadBalancerID != services.LBID(a.UID) || f.FixedIPAddress != a.Spec.ClusterIP {
		t.Fatalf("floating ip %+v (%v): want %s associated with the load balancer (fixed %s)", f, err, ip, a.Spec.ClusterIP)
	}
	if c := meta.FindStatusCondition(e.getSvc("lb", "a").Status.Conditions, services.ConditionFloatingIP); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("condition %+v", c)
	}

	// Requested address honored.
	b := e.createSvc(lbSvc("lb", "b", "192.0.2.77"))
	e.eventually(15*time.Second, "requested ingress of b", func() error {
		if got := ingressIP(e.getSvc("lb", "b")); got != "192.0.2.77" {
			return fmt.Errorf("ingress %q", got)
		}
		return nil
	})

	// The same address again: an Event and a False condition, no other
	// address.
	c := e.createSvc(lbSvc("lb", "c", "192.0.2.77"))
	e.eventually(15*time.Second, "taken address reported", func() error {
		s := e.getSvc("lb", "c")
		cond := meta.FindStatusCondition(s.Status.Conditions, services.ConditionFloatingIP)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != services.ReasonAddressTaken {
			return fmt.Errorf("condition %+v", cond)
		}
		if !slices.Contains(e.events(c), services.ReasonAddressTaken) {
			return fmt.Errorf("events %v", e.events(c))
		}
		return nil
	})
	if s := e.getSvc("lb", "c"); len(s.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("c got ingress %+v", s.Status.LoadBalancer.Ingress)
	}
	if _, err := e.ctl.GetFloatingIP(context.Background(), project, services.LBID(c.UID)); err == nil {
		t.Fatal("c holds a floating IP")
	}

	// Another class: its ClusterIP is served, no floating IP, no status.
	d := lbSvc("lb", "d", "")
	d.Spec.LoadBalancerClass = new("example.com/other")
	d = e.createSvc(d)
	e.waitLB(d, "other class's clusterIP load balancer", func(*capi.LoadBalancer) error { return nil })
	// Our class named explicitly.
	g := lbSvc("lb", "g", "")
	g.Spec.LoadBalancerClass = new(services.DefaultClass)
	g = e.createSvc(g)
	e.eventually(15*time.Second, "ingress of g", func() error {
		if ingressIP(e.getSvc("lb", "g")) == "" {
			return fmt.Errorf("no ingress")
		}
		return nil
	})
	if s := e.getSvc("lb", "d"); len(s.Status.LoadBalancer.Ingress) != 0 || len(s.Status.Conditions) != 0 {
		t.Fatalf("other class got status %+v", s.Status)
	}
	if _, err := e.ctl.GetFloatingIP(context.Background(), project, services.LBID(d.UID)); err == nil {
		t.Fatal("other class got a floating IP")
	}

	// Type change away from LoadBalancer releases the address.
	cur := e.getSvc("lb", "b")
	cur.Spec.Type = corev1.ServiceTypeClusterIP
	cur.Spec.LoadBalancerIP = ""
	for i := range cur.Spec.Ports {
		cur.Spec.Ports[i].NodePort = 0
	}
	cur.Spec.ExternalTrafficPolicy = ""
	cur.Spec.AllocateLoadBalancerNodePorts = nil
	if _, err := e.c.Client.CoreV1().Services("lb").Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(15*time.Second, "b's floating IP released", func() error {
		if _, err := e.ctl.GetFloatingIP(context.Background(), project, services.LBID(b.UID)); err == nil {
			return fmt.Errorf("still allocated")
		}
		if in := e.getSvc("lb", "b").Status.LoadBalancer.Ingress; len(in) != 0 {
			return fmt.Errorf("ingress %+v", in)
		}
		return nil
	})
	if _, err := e.lbOf(b); err != nil {
		t.Fatalf("b lost its clusterIP load balancer: %v", err)
	}
	// Freed, the address goes to c, which asked for it.
	e.eventually(10*time.Second, "c gets the freed address at once", func() error {
		if got := ingressIP(e.getSvc("lb", "c")); got != "192.0.2.77" {
			return fmt.Errorf("ingress %q", got)
		}
		return nil
	})

	// A Service that waits for a taken address and is deleted while it
	// waits leaves nothing waiting.
	h := e.createSvc(lbSvc("lb", "h", "192.0.2.77"))
	e.eventually(15*time.Second, "h waits for the taken address", func() error {
		if addrs, _ := e.r.Waiting(); addrs != 1 || !slices.Contains(e.events(h), services.ReasonAddressTaken) {
			return fmt.Errorf("%d addresses waited for, events %v", addrs, e.events(h))
		}
		return nil
	})
	for _, n := range []string{"a", "c", "d", "g", "h"} {
		e.deleteSvc("lb", n)
	}
	e.eventually(15*time.Second, "all floating IPs released, nothing waits", func() error {
		if fs := e.ourFIPs(); len(fs) != 0 {
			return fmt.Errorf("%d floating ips left: %+v", len(fs), fs)
		}
		if addrs, warned := e.r.Waiting(); addrs != 0 || warned != 0 {
			return fmt.Errorf("%d addresses waited for, %d Services warned", addrs, warned)
		}
		return nil
	})
	// Status writes merge by condition type: none conflicts with a cache a
	// moment behind (the noise an operator would chase).
	if n := e.logCount("the object has been modified"); n != 0 {
		t.Fatalf("%d status writes conflicted", n)
	}
}

// TestLoadBalancerCycles: 1,000 LoadBalancer Services created and deleted
// (in waves, some deleted before they were synced) leave 0 floating IPs
// and 0 load balancers.
func TestLoadBalancerCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 cycles")
	}
	e := start(t, true)
	e.reconciler(time.Minute)
	e.namespace("cyc")
	const waves, per = 20, 50
	ctx := context.Background()
	for w := range waves {
		var wg sync.WaitGroup
		errs := make(chan error, per)
		for i := range per {
			wg.Go(func() {
				name := fmt.Sprintf("s-%d-%d", w, i)
				if _, err := e.c.Client.CoreV1().Services("cyc").Create(ctx, lbSvc("cyc", name, ""), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				// Every fifth goes at once, racing its own sync.
				if i%5 != 0 {
					deadline := time.Now().Add(20 * time.Second)
					for {
						s, err := e.c.Client.CoreV1().Services("cyc").Get(ctx, name, metav1.GetOptions{})
						if err == nil && ingressIP(s) != "" {
							break
						}
						if time.Now().After(deadline) {
							errs <- fmt.Errorf("%s: no ingress in time", name)
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				if err := e.c.Client.CoreV1().Services("cyc").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	e.eventually(30*time.Second, "no floating IP and no load balancer left", func() error {
		fs, lbs := e.ourFIPs(), e.ourLBs()
		if len(fs) != 0 || len(lbs) != 1 { // the kubernetes Service's
			return fmt.Errorf("%d floating ips, %d load balancers left", len(fs), len(lbs))
		}
		return nil
	})
}

// TestNoExternalNetwork: without the external network, ClusterIPs work,
// a LoadBalancer Service gets an Event and a False condition, and once the
// network is created the next resync gives it an address. The absence is
// logged once, not at every resync.
func TestNoExternalNetwork(t *testing.T) {
	e := start(t, false)
	e.reconciler(time.Second)
	e.namespace("nx")
	s := e.createSvc(lbSvc("nx", "s", ""))
	e.waitLB(s, "clusterIP load balancer without an external network", func(*capi.LoadBalancer) error { return nil })
	// One more, deleted while it waits: it does not stay in the caches.
	gone := e.createSvc(lbSvc("nx", "gone", ""))
	e.eventually(15*time.Second, "both warned", func() error {
		if _, warned := e.r.Waiting(); warned != 2 {
			return fmt.Errorf("%d Services warned", warned)
		}
		return nil
	})
	e.deleteSvc("nx", gone.Name)
	e.eventually(15*time.Second, "the deleted one forgotten", func() error {
		if _, warned := e.r.Waiting(); warned != 1 {
			return fmt.Errorf("%d Services warned", warned)
		}
		return nil
	})
	e.eventually(15*time.Second, "missing network reported", func() error {
		cond := meta.FindStatusCondition(e.getSvc("nx", "s").Status.Conditions, services.ConditionFloatingIP)
		if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != services.ReasonNoExternal {
			return fmt.Errorf("condition %+v", cond)
		}
		if !slices.Contains(e.events(s), services.ReasonNoExternal) {
			return fmt.Errorf("events %v", e.events(s))
		}
		return nil
	})
	e.createExternal()
	e.eventually(15*time.Second, "address once the network exists", func() error {
		if ingressIP(e.getSvc("nx", "s")) == "" {
			return fmt.Errorf("no ingress")
		}
		return nil
	})
	// The start, the first resync and the one that found the network each
	// looked it up.
	if n := e.logCount("EXTERNAL NETWORK NOT FOUND"); n != 1 {
		t.Fatalf("the missing external network was logged %d times, want once", n)
	}
}
