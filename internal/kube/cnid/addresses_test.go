package cnid

import (
	"testing"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
)

// TestSameAddresses: the CNI result comes from the annotation only when it
// names the port's own MAC and addresses.
func TestSameAddresses(t *testing.T) {
	port := controllerapi.Port{MACAddress: "02:00:00:00:00:01",
		FixedIPs: []controllerapi.FixedIP{{IPAddress: "10.32.0.5"}, {IPAddress: "fd00:0::5"}}}
	for _, tt := range []struct {
		name string
		n    podnet.Network
		ok   bool
	}{
		{"same", podnet.Network{MAC: "02:00:00:00:00:01", IPs: []string{"fd00::5/64", "10.32.0.5/16"}}, true},
		{"MAC case", podnet.Network{MAC: "02:00:00:00:00:01", IPs: []string{"10.32.0.5/16", "fd00::5/64"}}, true},
		{"another address", podnet.Network{MAC: "02:00:00:00:00:01", IPs: []string{"10.32.0.9/16", "fd00::5/64"}}, false},
		{"one address missing", podnet.Network{MAC: "02:00:00:00:00:01", IPs: []string{"10.32.0.5/16"}}, false},
		{"another MAC", podnet.Network{MAC: "02:00:00:00:00:02", IPs: []string{"10.32.0.5/16", "fd00::5/64"}}, false},
	} {
		if e := sameAddresses(tt.n, port); (e == nil) != tt.ok {
			t.Errorf("%s: %v, want ok %v", tt.name, e, tt.ok)
		}
	}
}
