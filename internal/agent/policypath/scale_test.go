package policypath

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/internal/testutil"
)

// TestScale loads 100 pods with 2,000 exact tuples each (200,000
// elements) plus 20 ipBlock ranges each, then times single changes: one
// exact tuple added to a pod, and one range replaced (interval sets cost
// O(set size) per change in the kernel). Figures are logged; the test
// fails only when a change takes over a second.
func TestScale(t *testing.T) {
	testutil.RequireRoot(t)
	host := nettest.NewNS(t, testutil.UniqueName("ppts"))
	p := pathIn(t, host, "ppts")
	pods := map[string]*Pod{}
	for i := range 100 {
		pod := &Pod{IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Ingress: Dir{Isolated: true}}
		for k := range 2000 {
			peer := netip.AddrFrom4([4]byte{10, 2, byte(k / 20), byte(k)})
			pod.Ingress.Base = append(pod.Ingress.Base, exact(peer.String(), 6, uint16(1000+k%20)))
		}
		for k := range 20 {
			lo := netip.AddrFrom4([4]byte{172, 16, byte(k), 0})
			hi := netip.AddrFrom4([4]byte{172, 16, byte(k), 255})
			pod.Ingress.Base = append(pod.Ingress.Base, Allow{PeerLo: A4(lo), PeerHi: A4(hi), Proto: 6, PortLo: 80, PortHi: 90})
		}
		slices.SortFunc(pod.Ingress.Base, policyrule.Compare) // as the engine gives them
		pods[string(rune('a'+i%26))+string(rune('0'+i/26))] = pod
	}
	start := time.Now()
	if err := p.Sync(t.Context(), pods); err != nil {
		t.Fatal(err)
	}
	t.Logf("cold sync of %d elements: %v", p.Elements(), time.Since(start))
	var key string
	for k := range pods {
		key = k
		break
	}
	measure := func(what string, change func(i int, pod *Pod)) {
		var ds []time.Duration
		for i := range 50 {
			pod := *pods[key]
			pod.Ingress.Base = slices.Clone(pod.Ingress.Base)
			change(i, &pod)
			slices.SortFunc(pod.Ingress.Base, policyrule.Compare)
			t0 := time.Now()
			if err := p.Apply(t.Context(), map[string]*Pod{key: &pod}); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
			pods[key] = &pod
		}
		slices.Sort(ds)
		t.Logf("%s: p50 %v, p99 %v (%d elements)", what, ds[len(ds)/2], ds[len(ds)*99/100], p.Elements())
		if ds[len(ds)-1] > time.Second {
			t.Errorf("%s: a change took %v", what, ds[len(ds)-1])
		}
	}
	measure("one exact tuple added", func(i int, pod *Pod) {
		pod.Ingress.Base = append(pod.Ingress.Base, exact("10.3.0."+itoa(i), 6, 443))
	})
	measure("one range replaced", func(i int, pod *Pod) {
		for j, a := range pod.Ingress.Base {
			if a.PortLo == 80 && a.PortHi != a.PortLo {
				pod.Ingress.Base[j].PortHi = uint16(91 + i)
				break
			}
		}
	})
}

func itoa(i int) string { return netip.AddrFrom4([4]byte{0, 0, 0, byte(i)}).String()[6:] }
