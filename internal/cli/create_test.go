package cli

import (
	"errors"
	"testing"

	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestParseSpec(t *testing.T) {
	tests := []struct {
		name, in string
		apps     int
		bad      bool
	}{
		{"yaml", "name: web\nvolumes: [{name: shared, kind: empty}]\napps:\n- name: a\n  image: busybox\n  mounts: [{volume: shared, path: /s}]\n- name: b\n  image: busybox\n", 2, false},
		{"json", `{"apps":[{"image":"x","exec":["sleep","1"]}]}`, 1, false},
		{"unknown key", "apps: [{image: x}]\nbogus: 1\n", 0, true},
		{"no apps", "name: x\n", 0, true},
		{"bad volume", "apps: [{image: x, mounts: [{volume: v, path: /v}]}]\n", 0, true},
		{"not yaml", "apps: [", 0, true},
		{"list", "- a\n- b\n", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tc.in))
			if tc.bad {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err = %v, want Invalid", err)
				}
				return
			}
			if err != nil || len(s.Apps) != tc.apps {
				t.Fatalf("spec %+v, err %v", s, err)
			}
		})
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"name: web\napps:\n- image: busybox\n",
		`{"apps":[{"image":"x","exec":["sleep","1"]}],"volumes":[{"name":"v","kind":"host","source":"/tmp"}]}`,
		"apps: [{image: x, env: [{name: A, value: b}]}]", "", "null", "[]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error not Invalid: %v", err)
			}
			return
		}
		if err := wire.ValidateSpec(&s); err != nil {
			t.Fatalf("accepted spec fails validation: %v", err)
		}
	})
}
