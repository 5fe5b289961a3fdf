package services_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/services"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// startWatcher runs kurma-k8s-watcher (pods and Services) as a process.
func (e *env) startWatcher() interface{ Kill() } {
	e.t.Helper()
	return e.proc("watcher", filepath.Join(e.c.BinDir, "kurma-k8s-watcher"), "--kubeconfig", e.c.Kubeconfig,
		"--controller", "http://"+ctlAddr, "--token-file", filepath.Join(e.c.Dir, "ctl-token"),
		"--service-cidr", svcCIDR.String(), "--resync", "1h", "-v")
}

// TestKill9Converges: kurma-k8s-watcher is killed with SIGKILL in the
// middle of 200 Service and EndpointSlice changes, changes go on while it
// is down, a stale load balancer and floating IP are planted, and after
// the restart the controller holds exactly what the API says: one load
// balancer per Service with the right VIP, listeners and members, one
// floating IP per LoadBalancer Service, nothing else.
func TestKill9Converges(t *testing.T) {
	e := start(t, true)
	e.namespace("k9")
	ctx := context.Background()
	w := e.startWatcher()
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]bool{}
	const changes = 200
	for i := range changes {
		switch i {
		case 80:
			w.Kill()
		case 140:
			// Planted while the watcher is down: must be removed.
			if _, err := e.ctl.CreateLoadBalancer(ctx, project, capi.LoadBalancer{ID: services.LBPrefix + "stale",
				VIPSubnetID: "k8s-services", VIPAddress: "10.96.250.250"}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.ctl.CreateFloatingIP(ctx, project, capi.FloatingIP{ID: services.LBPrefix + "stale-fip",
				FloatingNetworkID: extNet}); err != nil {
				t.Fatal(err)
			}
			w = e.startWatcher()
		}
		name := fmt.Sprintf("s%d", rng.IntN(40))
		switch op := rng.IntN(10); {
		case !live[name] || op < 2:
			if live[name] {
				e.deleteSvc("k9", name)
				delete(live, name)
				continue
			}
			s := svc("k9", name, tcp("web", 80, intstr.FromString("web")), udp("dns", 53, intstr.FromInt32(53)))
			if rng.IntN(3) == 0 {
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
			}
			e.createSvc(s)
			live[name] = true
		default:
			var as []string
			for range rng.IntN(4) {
				a := fmt.Sprintf("10.32.%d.%d", rng.IntN(4), 1+rng.IntN(200))
				if rng.IntN(5) == 0 {
					a = "!" + a
				}
				as = append(as, a)
			}
			e.applySlice(endpoints("k9", name+"-x", name, []discoveryv1.EndpointPort{
				eport("web", corev1.ProtocolTCP, 8080), eport("dns", corev1.ProtocolUDP, 53)}, as...))
		}
	}
	_ = w
	e.eventually(30*time.Second, "controller matches the API exactly", func() error { return e.matches(ctx) })
}

// matches compares the controller's load balancers and floating IPs with
// what the API's Services and EndpointSlices call for.
func (e *env) matches(ctx context.Context) error {
	svcs, err := e.c.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sls, err := e.c.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	want := map[string][]string{} // lb id -> vip + sorted ready members
	wantFIP := map[string]bool{}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		members := []string{}
		seen := map[string]bool{}
		for _, sl := range sls.Items {
			if sl.Namespace != s.Namespace || sl.Labels[discoveryv1.LabelServiceName] != s.Name {
				continue
			}
			for _, ep := range sl.Endpoints {
				if (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && !seen[ep.Addresses[0]] {
					seen[ep.Addresses[0]] = true
					members = append(members, ep.Addresses[0])
				}
			}
		}
		slices.Sort(members)
		id := services.LBID(s.UID)
		want[id] = append([]string{s.Spec.ClusterIP, fmt.Sprint(len(s.Spec.Ports))}, members...)
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			wantFIP[id] = true
			if len(s.Status.LoadBalancer.Ingress) != 1 {
				return fmt.Errorf("%s/%s has ingress %+v", s.Namespace, s.Name, s.Status.LoadBalancer.Ingress)
			}
		}
	}
	lbs, err := e.ctl.ListLoadBalancers(ctx, project)
	if err != nil {
		return err
	}
	got := map[string][]string{}
	for _, lb := range lbs {
		if !strings.HasPrefix(lb.ID, services.LBPrefix) {
			continue
		}
		if _, dup := got[lb.ID]; dup {
			return fmt.Errorf("load balancer %s twice", lb.ID)
		}
		got[lb.ID] = append([]string{lb.VIPAddress, fmt.Sprint(len(lb.Listeners))}, addrs(&lb)...)
		if addrs(&lb) == nil {
			got[lb.ID] = append([]string{lb.VIPAddress, fmt.Sprint(len(lb.Listeners))}, []string{}...)
		}
	}
	for id, w := range want {
		if g, ok := got[id]; !ok || !slices.Equal(g, w) {
			return fmt.Errorf("load balancer %s: got %v, want %v", id, g, w)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			return fmt.Errorf("stale load balancer %s", id)
		}
	}
	fips, err := e.ctl.ListFloatingIPs(ctx, project)
	if err != nil {
		return err
	}
	n := 0
	for _, f := range fips {
		if !strings.HasPrefix(f.ID, services.LBPrefix) {
			continue
		}
		if !wantFIP[f.ID] || f.LoadBalancerID != f.ID {
			return fmt.Errorf("floating ip %+v not wanted or not associated", f)
		}
		n++
	}
	if n != len(wantFIP) {
		return fmt.Errorf("%d floating ips, want %d", n, len(wantFIP))
	}
	return nil
}
