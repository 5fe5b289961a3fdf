package podnet

import (
	"reflect"
	"testing"
)

// FuzzDecode: Decode never panics, and what it accepts encodes and
// decodes back to the same value.
func FuzzDecode(f *testing.F) {
	s, _ := Encode(good())
	f.Add(s)
	f.Add(`{"default":{"port_id":"p","project_id":"k8s","subnet_id":"s","mac_address":"02:00:00:00:00:01","ip_addresses":["fd00::5/64"],"pod_uid":"u","host_id":"h"}}`)
	f.Add(`{"default":{}}`)
	f.Add(`{"a":{"b":[1,{"c":2}]},"a":3}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, in string) {
		ns, err := Decode(in)
		if err != nil {
			return
		}
		out, err := Encode(ns)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", in, err)
		}
		back, err := Decode(out)
		if err != nil || !reflect.DeepEqual(back, ns) {
			t.Fatalf("re-decode of %q: %v, %+v != %+v", out, err, back, ns)
		}
	})
}
