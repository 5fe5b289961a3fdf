package policyrule

import (
	"net/netip"
	"testing"
)

func TestAddr4(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Addr4
	}{
		{"0.0.0.0", 0},
		{"10.64.1.2", 0x0a400102},
		{"255.255.255.255", 0xffffffff},
		{"fd00::1", 0}, // not IPv4
	} {
		a := netip.MustParseAddr(tc.in)
		got := A4(a)
		if got != tc.want {
			t.Errorf("A4(%s) = %#x, want %#x", tc.in, got, tc.want)
		}
		if a.Is4() && got.Addr() != a {
			t.Errorf("A4(%s).Addr() = %s", tc.in, got.Addr())
		}
	}
}

func TestAllowString(t *testing.T) {
	a := A4(netip.MustParseAddr("10.0.0.1"))
	for _, tc := range []struct {
		in   Allow
		want string
	}{
		{Allow{PeerLo: a, PeerHi: a}, "10.0.0.1"},
		{Allow{PeerLo: a, PeerHi: a + 9, Proto: 6, PortLo: 80, PortHi: 80}, "10.0.0.1-10.0.0.10 6/80"},
		{Allow{PeerLo: a, PeerHi: a, Proto: 17, PortLo: 53, PortHi: 60}, "10.0.0.1 17/53-60"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.in, got, tc.want)
		}
	}
}
