package api

import (
	"encoding/json"
	"testing"

	"kurma.dev/kurma/internal/controller/core"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// FuzzDecodePorts: any body either fails with a clean error or yields
// ports that normalize to something that re-encodes and decodes again.
func FuzzDecodePorts(f *testing.F) {
	for _, s := range []string{
		`{"port":{"network_id":"s1","id":"a","binding:host_id":"h","binding:profile":null,"allowed_address_pairs":[{}]}}`,
		`{"ports":[{"network_id":"s1","veth_namespace":"/run/netns/x"},{"network_id":"v1","fixed_ips":[{"ip_address":"10.0.0.5"}]}]}`,
		`{"port":{"network_id":"s1","mac_address":"02:00:00:00:00:01","binding:profile":{"a":1}}}`,
		`{"port":{}}`, `{"ports":[]}`, `{}`, `[]`, `{"port":{"x":1}}`, `{"port":1}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ports, _, err := DecodePorts(b)
		if err != nil {
			return
		}
		for i := range ports {
			p := ports[i]
			if err := core.NormalizePort("p1", &p); err != nil {
				continue
			}
			if p.ProjectID != "p1" || p.Status != capi.StatusPending || p.NetworkNS != p.VethNamespace {
				t.Fatalf("normalized port inconsistent: %+v", p)
			}
			if core.ValidID("port", p.ID) != nil || core.ValidID("network", p.NetworkID) != nil {
				t.Fatalf("invalid ids survived: %q %q", p.ID, p.NetworkID)
			}
			enc, err := json.Marshal(capi.PortBody{Port: p})
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if _, _, err := DecodePorts(enc); err != nil {
				t.Fatalf("re-decode of %s: %v", enc, err)
			}
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	for _, s := range []string{`{"status":"UP"}`, `{"status":"ERROR","status_reason":"x"}`, `{"status":"up"}`, `{"status":1}`, `{}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := DecodeStatus(b)
		if err != nil {
			return
		}
		switch u.Status {
		case capi.StatusUp, capi.StatusDown, capi.StatusError, capi.StatusPending:
		default:
			t.Fatalf("accepted status %q", u.Status)
		}
	})
}

func FuzzDecodeHost(f *testing.F) {
	for _, s := range []string{`{"host":{"id":"h1","underlay_ip":"192.0.2.1"}}`, `{"host":{"underlay_ip":"fd00::1"}}`, `{"host":{"underlay_ip":"x"}}`, `{}`} {
		f.Add("h1", []byte(s))
	}
	f.Fuzz(func(t *testing.T, id string, b []byte) {
		h, err := DecodeHost(id, b)
		if err != nil {
			return
		}
		if h.ID != id || h.UnderlayIP == "" {
			t.Fatalf("accepted host %+v for id %q", h, id)
		}
	})
}

func FuzzDecodeSubnetBody(f *testing.F) {
	for _, s := range []string{`{"subnet":{"network_id":"v1","cidr":"10.0.0.0/24","allocation_pools":[{"start":"10.0.0.5","end":"10.0.0.9"}]}}`, `{"subnet":{"cidr":"fd00::/64","ip_version":6}}`, `{"subnet":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var body struct {
			Subnet *capi.Subnet `json:"subnet"`
		}
		_ = decodeStrict(b, &body)
	})
}
