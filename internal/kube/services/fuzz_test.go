package services

import (
	"encoding/json"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// FuzzDesired feeds desired arbitrary Services and EndpointSlices (as the
// API server would send them, JSON) and checks what it promises the
// controller: a VIP inside the service range, unique listeners with ports
// in 1-65535, unique members inside the VPC, at most MaxMembers.
func FuzzDesired(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"a","namespace":"n","uid":"u"},"spec":{"clusterIP":"10.96.0.10","ports":[{"name":"http","port":80,"targetPort":"web"},{"port":53,"protocol":"UDP","targetPort":5353}],"sessionAffinity":"ClientIP"}}`),
		[]byte(`{"addressType":"IPv4","ports":[{"name":"http","port":8080}],"endpoints":[{"addresses":["10.32.0.5"]},{"addresses":["10.32.0.6"],"conditions":{"ready":false}},{"addresses":["1.2.3.4"]}]}`))
	f.Add([]byte(`{"spec":{"clusterIP":"None"}}`), []byte(`{}`))
	f.Add([]byte(`{"spec":{"clusterIPs":["fd00::1","10.96.1.1"],"ports":[{"port":0},{"port":70000,"targetPort":-1}]}}`),
		[]byte(`{"addressType":"IPv4","ports":[{"port":0},{"port":99999}],"endpoints":[{"addresses":["10.32.0.5"]},{"addresses":["10.32.0.5"]},{"addresses":[]}]}`))
	svcCIDR := netip.MustParsePrefix("10.96.0.0/16")
	vpc := netip.MustParsePrefix("10.32.0.0/11")
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON []byte) {
		var svc corev1.Service
		var sl discoveryv1.EndpointSlice
		if json.Unmarshal(svcJSON, &svc) != nil || json.Unmarshal(sliceJSON, &sl) != nil {
			return
		}
		w := desired(&svc, []*discoveryv1.EndpointSlice{&sl, &sl}, svcCIDR, vpc)
		if w == nil {
			return
		}
		if a, err := netip.ParseAddr(w.VIP); err != nil || !svcCIDR.Contains(a) {
			t.Fatalf("vip %q outside %s", w.VIP, svcCIDR)
		}
		seen := map[string]bool{}
		for _, l := range w.Listeners {
			k := l.Protocol + "/" + itoa(l.Port)
			if seen[k] || l.Port < 1 || l.Port > 65535 || l.TargetPort < 1 || l.TargetPort > 65535 {
				t.Fatalf("bad or repeated listener %+v", l)
			}
			seen[k] = true
		}
		if len(w.Members) > MaxMembers {
			t.Fatalf("%d members", len(w.Members))
		}
		ms := map[string]bool{}
		for _, m := range w.Members {
			a, err := netip.ParseAddr(m.Address)
			k := m.Address + "/" + itoa(m.Port)
			if err != nil || !vpc.Contains(a) || ms[k] || m.Port < 0 || m.Port > 65535 {
				t.Fatalf("bad or repeated member %+v", m)
			}
			ms[k] = true
		}
	})
}
