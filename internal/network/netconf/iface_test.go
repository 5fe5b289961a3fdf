package netconf

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

const podUUID = "146d7cef-fbf6-41da-a2f8-eba218597f9c"

func TestRender(t *testing.T) {
	tests := []struct {
		name, text string
		index      int
		existing   []string
		rand       string
		want       string
	}{
		{"plain", "eth0", 0, []string{"lo"}, "", "eth0"},
		{"index field", "eth{{.Index}}", 2, []string{"lo", "eth0", "eth1"}, "", "eth2"},
		{"index func", "net{{netindex}}", 1, nil, "", "net1"},
		{"short uuid", "k{{shortuuid}}", 0, nil, "", "k146d7cef"},
		{"random", "k{{shortuuid}}{{random 3}}", 0, nil, "\x00\x01\x1a", "k146d7cefab0"},
		{"uuid slice", `{{slice uuid 0 4}}x`, 0, nil, "", "146dx"},
		{"network", `{{.Network}}`, 0, nil, "", "mynet"},
		{"if", `{{if eq .Index 0}}eth0{{else}}net{{.Index}}{{end}}`, 3, nil, "", "net3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := CompileIface(tc.text)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(RenderOptions{PodUUID: podUUID, Index: tc.index, Network: "mynet",
				Existing: tc.existing, Rand: bytes.NewReader([]byte(tc.rand))})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("rendered %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRenderRetriesRandomCollision(t *testing.T) {
	tmpl, err := CompileIface("k{{random 2}}")
	if err != nil {
		t.Fatal(err)
	}
	// First draw gives "kaa" (taken), second "kbb".
	got, err := tmpl.Render(RenderOptions{PodUUID: podUUID, Existing: []string{"lo", "kaa"},
		Rand: bytes.NewReader([]byte{0, 0, 1, 1})})
	if err != nil {
		t.Fatal(err)
	}
	if got != "kbb" {
		t.Fatalf("got %q, want kbb", got)
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name, text string
		existing   []string
		compile    bool // error expected at compile time
		cat        error
		want       string
	}{
		{"collision", "eth{{.Index}}", []string{"lo", "eth0"}, false, kerrors.Conflict, "already used"},
		{"loopback", "lo", []string{"lo"}, false, kerrors.Conflict, "already used"},
		{"too long", "{{uuid}}", nil, true, kerrors.Invalid, "longer than 15"},
		{"slash", "a/b", nil, true, kerrors.Invalid, "contains"},
		{"colon", "a:b", nil, true, kerrors.Invalid, "contains"},
		{"space", "a b", nil, true, kerrors.Invalid, "contains"},
		{"dot", ".", nil, true, kerrors.Invalid, "not allowed"},
		{"dotdot", "..", nil, true, kerrors.Invalid, "not allowed"},
		{"empty render", "{{if false}}x{{end}}", nil, true, kerrors.Invalid, "empty"},
		{"random range", "k{{random 16}}", nil, true, kerrors.Invalid, "random 16"},
		{"unknown func", "{{nope}}", nil, true, kerrors.Invalid, "nope"},
		{"unknown field", "{{.Nope}}", nil, true, kerrors.Invalid, "Nope"},
		{"range", "{{range 1000000000}}{{end}}x", nil, true, kerrors.Invalid, "range"},
		{"define", `{{define "x"}}a{{end}}b`, nil, true, kerrors.Invalid, "define"},
		{"huge output", `{{printf "%0999d" 1}}`, nil, true, kerrors.Invalid, "longer than 15"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := CompileIface(tc.text)
			if !tc.compile {
				if err != nil {
					t.Fatalf("compile: %v", err)
				}
				_, err = tmpl.Render(RenderOptions{PodUUID: podUUID, Existing: tc.existing})
			}
			if err == nil {
				t.Fatalf("no error for %q", tc.text)
			}
			if !errors.Is(err, tc.cat) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want category %v and text %q", err, tc.cat, tc.want)
			}
		})
	}
}

func TestValidIfName(t *testing.T) {
	for _, ok := range []string{"eth0", "a", "k146d7cefab0123", "veth-x_y.z", "ÿ"} {
		if err := ValidIfName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a:b", "a\tb", "a\nb", "a\x00b", "0123456789abcdef", "\xff"} {
		if err := ValidIfName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzRenderIface(f *testing.F) {
	for _, s := range []string{"eth0", "eth{{.Index}}", "k{{shortuuid}}{{random 3}}", "{{uuid}}", "{{if .Index}}x{{end}}", "{{printf \"%s\" .Network}}"} {
		f.Add(s, podUUID, 1, []byte("0123456789abcdef"))
	}
	f.Fuzz(func(t *testing.T, text, uuid string, index int, rnd []byte) {
		tmpl, err := CompileIface(text)
		if err != nil {
			return
		}
		name, err := tmpl.Render(RenderOptions{PodUUID: uuid, Index: index, Network: "n", Existing: []string{"lo"}, Rand: bytes.NewReader(rnd)})
		if err != nil {
			return
		}
		if ValidIfName(name) != nil || name == "lo" {
			t.Fatalf("template %q rendered invalid or colliding name %q", text, name)
		}
	})
}
