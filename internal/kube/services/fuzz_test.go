package services

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// FuzzDesired feeds desired arbitrary Services and EndpointSlices (as the
// API server would send them, JSON) and checks what it promises the
// controller: a VIP inside the service range, and a load balancer the
// controller's contract accepts (or a warning that it is refused), with
// members outside the VPC marked external.
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
		w := desired(&svc, []*discoveryv1.EndpointSlice{&sl, &sl}, svcCIDR, vpc, nil)
		if w == nil {
			return
		}
		if a, err := netip.ParseAddr(w.VIP); err != nil || !svcCIDR.Contains(a) {
			t.Fatalf("vip %q outside %s", w.VIP, svcCIDR)
		}
		refused := slices.ContainsFunc(w.Warnings, func(s string) bool { return strings.Contains(s, "refused") })
		if _, err := capi.NormalizeListeners(w.Listeners); err != nil && !refused {
			t.Fatalf("listeners refused without a warning: %v", err)
		}
		if _, err := capi.NormalizeMembers(w.Members); err != nil && !refused {
			t.Fatalf("members refused without a warning: %v", err)
		}
		if err := capi.CheckMemberListeners(w.Listeners, w.Members); err != nil {
			t.Fatalf("members name missing listeners: %v", err)
		}
		for _, m := range w.Members {
			a, err := netip.ParseAddr(m.Address)
			if err != nil || vpc.Contains(a) == m.External {
				t.Fatalf("member %+v: external must say whether it lies outside %s", m, vpc)
			}
		}
	})
}
