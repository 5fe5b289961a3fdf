package netconf

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func mustParse(t *testing.T, entries ...string) []Network {
	t.Helper()
	raw := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		raw[i] = json.RawMessage(e)
	}
	nets, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return nets
}

func TestSelect(t *testing.T) {
	nets := mustParse(t,
		`{"name":"a","aci":"x","type":"bridge","default":true}`,
		`{"name":"b","aci":"x","type":"bridge"}`,
		`{"name":"c","aci":"x","type":"bridge","default":true}`)
	tests := []struct {
		names []string
		want  string
		cat   error
	}{
		{nil, "a,c", nil},
		{[]string{"b"}, "b", nil},
		{[]string{"c", "a"}, "c,a", nil},
		{[]string{"zz"}, "", kerrors.NotFound},
		{[]string{"a", "a"}, "", kerrors.Invalid},
		{[]string{"a", "host"}, "", kerrors.Invalid},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			got, err := Select(nets, tc.names)
			if tc.cat != nil {
				if !errors.Is(err, tc.cat) {
					t.Fatalf("error %v, want %v", err, tc.cat)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, n := range got {
				names = append(names, n.Name)
			}
			if strings.Join(names, ",") != tc.want {
				t.Fatalf("got %v, want %s", names, tc.want)
			}
		})
	}
}

func TestInterfaceNames(t *testing.T) {
	tests := []struct {
		name    string
		entries []string
		want    string
		cat     error
	}{
		{"indexed", []string{
			`{"name":"a","aci":"x","type":"bridge","containerInterface":"eth{{.Index}}"}`,
			`{"name":"b","aci":"x","type":"bridge","containerInterface":"eth{{.Index}}"}`}, "eth0,eth1", nil},
		{"no interface", []string{
			`{"name":"lo","aci":"x","type":"loopback"}`,
			`{"name":"b","aci":"x","type":"bridge","containerInterface":"eth0"}`}, ",eth0", nil},
		{"clash between networks", []string{
			`{"name":"a","aci":"x","type":"bridge","containerInterface":"eth0"}`,
			`{"name":"b","aci":"x","type":"bridge","containerInterface":"eth0"}`}, "", kerrors.Conflict},
		{"clash with loopback", []string{
			`{"name":"a","aci":"x","type":"bridge","containerInterface":"lo"}`}, "", kerrors.Conflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := InterfaceNames(mustParse(t, tc.entries...), RenderOptions{PodUUID: podUUID})
			if tc.cat != nil {
				if !errors.Is(err, tc.cat) {
					t.Fatalf("error %v, want %v", err, tc.cat)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != tc.want {
				t.Fatalf("got %q, want %s", got, tc.want)
			}
		})
	}
}
