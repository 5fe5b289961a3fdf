package api

import (
	"encoding/json"
	"net/netip"
	"testing"

	"kurma.dev/kurma/internal/controller/core"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

// FuzzDecodeLoadBalancers: any body either fails cleanly or yields load
// balancers that normalize to something valid that re-encodes and decodes
// again to the same thing.
func FuzzDecodeLoadBalancers(f *testing.F) {
	for _, s := range []string{
		`{"loadbalancer":{"vip_subnet_id":"svc","listeners":[{"protocol":"TCP","port":80,"target_port":8080}],"members":[{"address":"10.0.0.5","port":81,"port_id":"p"}],"session_persistence":{"type":"SOURCE_IP","timeout":60}}}`,
		`{"loadbalancers":[{"vip_subnet_id":"s","vip_address":"10.96.0.10"},{"id":"b","vip_subnet_id":"s","listeners":[{"protocol":"udp","port":53}]}]}`,
		`{"loadbalancer":{"vip_subnet_id":"s","listeners":[{"protocol":"TCP","port":80},{"protocol":"TCP","port":80}]}}`,
		`{"loadbalancer":{"vip_subnet_id":"s","members":[{"address":"::ffff:10.0.0.1"},{"address":"10.0.0.1"}]}}`,
		`{"loadbalancer":{}}`, `{"loadbalancers":[]}`, `{}`, `{"loadbalancer":{"x":1}}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		lbs, _, err := DecodeLoadBalancers(b)
		if err != nil {
			return
		}
		for i := range lbs {
			lb := lbs[i]
			if err := core.NormalizeLoadBalancer("p1", &lb); err != nil {
				continue
			}
			if lb.ProjectID != "p1" || core.ValidID("lb", lb.ID) != nil || core.ValidID("subnet", lb.VIPSubnetID) != nil {
				t.Fatalf("normalized load balancer inconsistent: %+v", lb)
			}
			seen := map[capi.Listener]bool{}
			for _, l := range lb.Listeners {
				k := capi.Listener{Protocol: l.Protocol, Port: l.Port}
				if seen[k] || l.Port < 1 || l.Port > 65535 || l.TargetPort < 1 || l.TargetPort > 65535 ||
					(l.Protocol != "TCP" && l.Protocol != "UDP" && l.Protocol != "SCTP") {
					t.Fatalf("bad listener survived: %+v", l)
				}
				seen[k] = true
			}
			for _, m := range lb.Members {
				if _, err := netip.ParseAddr(m.Address); err != nil || m.Port < 0 || m.Port > 65535 {
					t.Fatalf("bad member survived: %+v", m)
				}
			}
			if p := lb.SessionPersistence; p != nil && (p.Type != capi.PersistenceSourceIP || p.Timeout < 1 || p.Timeout > 86400) {
				t.Fatalf("bad persistence survived: %+v", p)
			}
			enc, err := json.Marshal(capi.LoadBalancerBody{LoadBalancer: lb})
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			again, _, err := DecodeLoadBalancers(enc)
			if err != nil {
				t.Fatalf("re-decode of %s: %v", enc, err)
			}
			if err := core.NormalizeLoadBalancer("p1", &again[0]); err != nil {
				t.Fatalf("normalized load balancer %s no longer valid: %v", enc, err)
			}
		}
	})
}

func FuzzDecodeMembers(f *testing.F) {
	for _, s := range []string{`{"members":[{"address":"10.0.0.1","port":80}]}`, `{"members":[]}`, `{"members":null}`, `{}`, `{"members":[{"address":"fe80::1%eth0"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := DecodeMembers(b)
		if err != nil {
			return
		}
		if ms == nil {
			t.Fatal("accepted members body yields nil")
		}
		lb := capi.LoadBalancer{VIPSubnetID: "s", Members: ms}
		if err := core.NormalizeLoadBalancer("p", &lb); err != nil {
			return
		}
		for _, m := range lb.Members {
			a, err := netip.ParseAddr(m.Address)
			if err != nil || a.Zone() != "" || a.String() != m.Address {
				t.Fatalf("member address not canonical: %+v", m)
			}
		}
	})
}

func FuzzDecodeLoadBalancerUpdate(f *testing.F) {
	for _, s := range []string{`{"loadbalancer":{"name":"a","listeners":[{"protocol":"TCP","port":1}]}}`, `{"loadbalancer":{"clear_session_persistence":true}}`, `{"loadbalancer":{"vip_address":"1.2.3.4"}}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeLoadBalancerUpdate(b)
	})
}

func FuzzDecodeFloatingIP(f *testing.F) {
	for _, s := range []string{
		`{"floatingip":{"floating_network_id":"ext","floating_ip_address":"192.0.2.9","port_id":"p"}}`,
		`{"floatingip":{"floating_network_id":"ext","loadbalancer_id":"lb","port_id":"p"}}`,
		`{"floatingip":{}}`, `{"floatingip":{"status":"ACTIVE"}}`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fip, err := DecodeFloatingIP(b)
		if err != nil {
			return
		}
		if err := core.NormalizeFloatingIP("p1", &fip); err != nil {
			return
		}
		if fip.ProjectID != "p1" || (fip.PortID != "" && fip.LoadBalancerID != "") || fip.Status != "" || fip.FixedIPAddress != "" ||
			core.ValidID("floatingip", fip.ID) != nil || core.ValidID("extnet", fip.FloatingNetworkID) != nil {
			t.Fatalf("normalized floating IP inconsistent: %+v", fip)
		}
	})
}

func FuzzDecodeFloatingIPAssociation(f *testing.F) {
	for _, s := range []string{`{"floatingip":{"port_id":"p"}}`, `{"floatingip":{"port_id":null}}`, `{"floatingip":{"loadbalancer_id":"l"}}`, `{"floatingip":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeFloatingIPAssociation(b)
	})
}

func FuzzDecodeExternalNetwork(f *testing.F) {
	for _, s := range []string{`{"external_network":{"id":"ext","cidr":"192.0.2.0/24","allocation_pools":[{"start":"192.0.2.10","end":"192.0.2.20"}]}}`, `{"external_network":{"cidr":"2001:db8::/64"}}`, `{"external_network":{"cidr":7}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeExternalNetwork(b)
	})
}
