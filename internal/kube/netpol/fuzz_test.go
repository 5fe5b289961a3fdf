package netpol

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzBlockRanges: an ipBlock is outside input; its ranges must be
// sorted, disjoint, inside the CIDR and outside every except.
func FuzzBlockRanges(f *testing.F) {
	f.Add("10.0.0.0/8", "10.1.0.0/16,10.2.3.4/32")
	f.Add("0.0.0.0/0", "0.0.0.0/0")
	f.Add("fd00::/8", "fd00::/16")
	f.Add("10.0.0.0/33", "")
	f.Fuzz(func(t *testing.T, cidr, excepts string) {
		var ex []string
		if excepts != "" {
			ex = strings.Split(excepts, ",")
		}
		rs, err := BlockRanges(cidr, ex)
		if err != nil {
			return
		}
		pfx := netip.MustParsePrefix(cidr).Masked()
		var prev netip.Addr
		for i, r := range rs {
			if r[1].Less(r[0]) || !pfx.Contains(r[0]) || !pfx.Contains(r[1]) {
				t.Fatalf("range %v outside %v", r, pfx)
			}
			if i > 0 && !prev.Less(r[0]) {
				t.Fatalf("ranges overlap or unsorted: %v", rs)
			}
			prev = r[1]
			for _, e := range ex {
				ep := netip.MustParsePrefix(e).Masked()
				if ep.Contains(r[0]) || ep.Contains(r[1]) {
					t.Fatalf("range %v holds an address of except %v", r, ep)
				}
			}
		}
	})
}
