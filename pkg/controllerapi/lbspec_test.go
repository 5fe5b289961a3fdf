package controllerapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzNormalizeLoadBalancer: whatever a client sends, the contract's
// normalization either refuses it or returns a canonical form that
// normalizes to itself, survives a JSON round trip unchanged (what the
// controller stores is what it returns) and satisfies CheckMemberListeners
// when it accepted them.
func FuzzNormalizeLoadBalancer(f *testing.F) {
	f.Add([]byte(`{"listeners":[{"protocol":"udp","port":53,"node_port":30053},{"protocol":"TCP","port":80}],` +
		`"members":[{"address":"10.0.0.5","port":8080,"listeners":["tcp/80","TCP/80"]},{"address":"::ffff:10.0.0.6","backup":true}],` +
		`"external_addresses":["198.51.100.9","198.51.100.1"],"external_local":true,"health_check_node_port":31000}`))
	f.Add([]byte(`{"listeners":[{"protocol":"TCP","port":80}],"members":[{"address":"10.0.0.5"},{"address":"10.0.0.5","listeners":["TCP/80"]}]}`))
	f.Add([]byte(`{"members":[{"address":"fd00::1"},{"address":"10.0.0.1","listeners":["SCTP/0"]}],"external_addresses":["x"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var lb LoadBalancer
		if json.Unmarshal(b, &lb) != nil {
			return
		}
		ls, err1 := NormalizeListeners(lb.Listeners)
		ms, err2 := NormalizeMembers(lb.Members)
		pol := lb.Policy
		err3 := NormalizePolicy(&pol)
		if err1 != nil || err2 != nil || err3 != nil {
			return
		}
		ls2, _ := NormalizeListeners(ls)
		ms2, _ := NormalizeMembers(ms)
		pol2 := pol
		_ = NormalizePolicy(&pol2)
		if !reflect.DeepEqual(ls, ls2) || !reflect.DeepEqual(ms, ms2) || !reflect.DeepEqual(pol, pol2) {
			t.Fatalf("not idempotent:\n%+v %+v %+v\n%+v %+v %+v", ls, ms, pol, ls2, ms2, pol2)
		}
		out := LoadBalancer{Listeners: ls, Members: ms, Policy: pol}
		j, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		var back LoadBalancer
		if err := json.Unmarshal(j, &back); err != nil || !reflect.DeepEqual(back, out) {
			t.Fatalf("JSON round trip changed it:\n%+v\n%+v (%v)", out, back, err)
		}
		if CheckMemberListeners(ls, ms) == nil {
			for _, m := range ms {
				if m.Address == "" || m.Port < 0 || m.Port > 65535 {
					t.Fatalf("accepted member %+v", m)
				}
			}
		}
	})
}

func TestNormalizeMembers(t *testing.T) {
	tests := []struct {
		name string
		in   []Member
		want []Member // nil with err
		err  string
	}{
		{"empty is nil", []Member{}, nil, ""},
		{"sorted, listener names canonical", []Member{{Address: "10.0.0.9"}, {Address: "::ffff:10.0.0.2", Listeners: []string{"udp/53", "TCP/80", "UDP/53"}}},
			[]Member{{Address: "10.0.0.2", Listeners: []string{"TCP/80", "UDP/53"}}, {Address: "10.0.0.9"}}, ""},
		{"one address and port for disjoint listeners", []Member{{Address: "10.0.0.2", Listeners: []string{"TCP/81"}}, {Address: "10.0.0.2", Listeners: []string{"TCP/80"}}},
			[]Member{{Address: "10.0.0.2", Listeners: []string{"TCP/80"}}, {Address: "10.0.0.2", Listeners: []string{"TCP/81"}}}, ""},
		{"twice for every listener", []Member{{Address: "10.0.0.2"}, {Address: "10.0.0.2", Listeners: []string{"TCP/80"}}}, nil, "members[1]"},
		{"every listener after some", []Member{{Address: "10.0.0.2", Listeners: []string{"TCP/80"}}, {Address: "10.0.0.2"}}, nil, "members[1]"},
		{"overlapping listeners", []Member{{Address: "10.0.0.2", Listeners: []string{"TCP/80", "TCP/82"}}, {Address: "10.0.0.2", Listeners: []string{"TCP/81"}},
			{Address: "10.0.0.2", Listeners: []string{"TCP/82"}}}, nil, "members[2]"},
		{"ipv6", []Member{{Address: "fd00::1"}}, nil, "only IPv4"},
		{"bad listener", []Member{{Address: "10.0.0.2", Listeners: []string{"TCP/080"}}}, nil, "listeners[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NormalizeMembers(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one naming %q", err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
