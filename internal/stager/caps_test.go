package stager

import (
	"encoding/json"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestAppPrivileges(t *testing.T) {
	iso := func(name, value string) appc.Isolator {
		return appc.Isolator{Name: name, Value: json.RawMessage(value)}
	}
	for _, tc := range []struct {
		name      string
		isolators []appc.Isolator
		want      Privileges
		invalid   bool
	}{
		{"default", nil, Privileges{Caps: 0xa80425fb}, false},
		{"retain widens", []appc.Isolator{iso(IsolatorCapsRetain, `{"set":["CAP_SYS_ADMIN","net_admin"]}`)},
			Privileges{Caps: 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_NET_ADMIN}, false},
		{"remove narrows", []appc.Isolator{iso(IsolatorCapsRemove, `{"set":["CAP_NET_RAW"]}`)},
			Privileges{Caps: 0xa80425fb &^ (1 << unix.CAP_NET_RAW)}, false},
		{"retain then remove", []appc.Isolator{iso(IsolatorCapsRemove, `{"set":["CAP_KILL"]}`), iso(IsolatorCapsRetain, `{"set":["CAP_KILL","CAP_CHOWN"]}`)},
			Privileges{Caps: 1 << unix.CAP_CHOWN}, false},
		{"new privileges allowed", []appc.Isolator{iso(IsolatorNoNewPrivs, `false`)}, Privileges{Caps: 0xa80425fb, AllowNewPrivs: true}, false},
		{"other isolators ignored", []appc.Isolator{iso("resource/memory", `{"limit":"1G"}`)}, Privileges{Caps: 0xa80425fb}, false},
		{"unknown capability", []appc.Isolator{iso(IsolatorCapsRetain, `{"set":["CAP_FLY"]}`)}, Privileges{}, true},
		{"bad value", []appc.Isolator{iso(IsolatorCapsRemove, `["CAP_KILL"]`)}, Privileges{}, true},
		{"bad no-new-privileges", []appc.Isolator{iso(IsolatorNoNewPrivs, `"no"`)}, Privileges{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := appPrivileges(tc.isolators)
			if tc.invalid {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("got %v, want an Invalid error", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzAppPrivileges(f *testing.F) {
	f.Add(IsolatorCapsRetain, []byte(`{"set":["CAP_SYS_ADMIN"]}`))
	f.Add(IsolatorCapsRemove, []byte(`{"set":["kill","CAP_NET_RAW"]}`))
	f.Add(IsolatorNoNewPrivs, []byte(`false`))
	f.Add(IsolatorCapsRetain, []byte(`{"set":null}`))
	f.Fuzz(func(t *testing.T, name string, value []byte) {
		p, err := appPrivileges([]appc.Isolator{{Name: name, Value: value}})
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error %v is not Invalid", err)
			}
			return
		}
		if name == IsolatorCapsRemove && p.Caps&^DefaultCaps != 0 {
			t.Fatalf("remove-set widened the set: %#x", p.Caps)
		}
		if name != IsolatorCapsRetain && name != IsolatorCapsRemove && p.Caps != DefaultCaps {
			t.Fatalf("%q changed the capabilities", name)
		}
	})
}
