package podports

import (
	"errors"
	"net/netip"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestNextFree(t *testing.T) {
	pp := netip.MustParsePrefix
	for _, tc := range []struct {
		name, pool string
		bits       int
		used       []string
		want       string
		err        error
	}{
		{"empty pool", "10.32.0.0/12", 16, nil, "10.32.0.0/16", nil},
		{"skip used", "10.32.0.0/12", 16, []string{"10.32.0.0/16", "10.33.0.0/16"}, "10.34.0.0/16", nil},
		{"fill hole", "10.32.0.0/12", 16, []string{"10.32.0.0/16", "10.34.0.0/16"}, "10.33.0.0/16", nil},
		{"small used inside block", "10.32.0.0/12", 16, []string{"10.32.7.0/24"}, "10.33.0.0/16", nil},
		{"big used", "10.32.0.0/12", 16, []string{"10.32.0.0/13"}, "10.40.0.0/16", nil},
		{"exhausted", "10.32.0.0/15", 16, []string{"10.32.0.0/16", "10.33.0.0/16"}, "", kerrors.Exhausted},
		{"end of space", "255.255.0.0/16", 17, []string{"255.255.0.0/17"}, "255.255.128.0/17", nil},
		{"end of space full", "255.255.0.0/16", 16, []string{"255.255.0.0/16"}, "", kerrors.Exhausted},
		{"block larger than pool", "10.32.0.0/16", 12, nil, "", kerrors.Invalid},
		{"v6", "fd00:10::/48", 64, []string{"fd00:10::/64"}, "fd00:10:0:1::/64", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var used []netip.Prefix
			for _, u := range tc.used {
				used = append(used, pp(u))
			}
			got, err := nextFree(pp(tc.pool), tc.bits, used)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil || got.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}
