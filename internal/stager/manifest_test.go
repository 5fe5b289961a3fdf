package stager

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

var testID = "sha512-" + strings.Repeat("ab", 64)

func validManifest() stagerspec.Manifest {
	return stagerspec.Manifest{
		Name: "p",
		Pod: appc.PodManifest{ACKind: appc.KindPodManifest, ACVersion: appc.ACVersion,
			Apps: []appc.RuntimeApp{{Name: "web", Image: appc.RuntimeImage{ID: testID}}}},
		Images: map[string]appc.ImageManifest{testID: {ACKind: appc.KindImageManifest, Name: "x",
			App: &appc.App{Exec: []string{"/bin/web", "-v"}, User: "1", Group: "2",
				Environment: []appc.EnvVar{{Name: "A", Value: "img"}}}}},
		AppImageOrder: map[string][]string{"web": {testID}},
	}
}

func TestParseManifest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(m map[string]any)
		raw     string
		union   string
		grace   time.Duration
		wantErr bool
	}{
		{name: "valid", grace: DefaultGrace},
		{name: "config", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"union": "copy", "gracePeriod": "2s"} }, union: "copy", grace: 2 * time.Second},
		{name: "fs alias", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"fs": "overlay"} }, union: "overlay", grace: DefaultGrace},
		{name: "unknown union", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"union": "aufs"} }, wantErr: true},
		{name: "bad grace", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"gracePeriod": "-1s"} }, wantErr: true},
		{name: "log size", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"logMaxBytes": 4096} }, grace: DefaultGrace},
		{name: "log size too small", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"logMaxBytes": 100} }, wantErr: true},
		{name: "log size negative", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"logMaxBytes": -1} }, wantErr: true},
		{name: "log size not a number", edit: func(m map[string]any) { m["stagerConfig"] = map[string]any{"logMaxBytes": "10M"} }, wantErr: true},
		{name: "config not an object", edit: func(m map[string]any) { m["stagerConfig"] = 5 }, wantErr: true},
		{name: "no order", edit: func(m map[string]any) { m["appImageOrder"] = map[string]any{} }, wantErr: true},
		{name: "reserved app name", edit: func(m map[string]any) {
			m["appImageOrder"] = map[string]any{"init": []string{testID}}
			pod := m["pod"].(map[string]any)
			pod["apps"].([]any)[0].(map[string]any)["name"] = "init"
		}, wantErr: true},
		{name: "not json", raw: "{", wantErr: true},
		{name: "empty", raw: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := []byte(tc.raw)
			if tc.raw == "" && tc.name != "empty" {
				vm := validManifest()
				mb, _ := json.Marshal(vm)
				var m map[string]any
				_ = json.Unmarshal(mb, &m)
				if tc.edit != nil {
					tc.edit(m)
				}
				b, _ = json.Marshal(m)
			}
			m, cfg, err := ParseManifest(b)
			if tc.wantErr {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err %v, want Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Name != "p" || cfg.Union != tc.union || cfg.Grace() != tc.grace {
				t.Errorf("got %q %+v grace %v", m.Name, cfg, cfg.Grace())
			}
		})
	}
}

func TestParseRunSettings(t *testing.T) {
	for _, tc := range []struct {
		in  string
		ok  bool
		tty bool
	}{
		{in: `{"exec":["/bin/sh"],"user":"0","group":"0","tty":true}`, ok: true, tty: true},
		{in: `{"exec":["sh"],"user":"root","group":"root","workingDirectory":"/tmp","supplementaryGIDs":[1,2]}`, ok: true},
		{in: `{"exec":[],"user":"0","group":"0"}`},
		{in: `{"exec":["x"],"user":"0"}`},
		{in: `{"exec":["x"],"user":"0","group":"0","environment":[{"name":"1A","value":""}]}`},
		{in: `{"exec":["x"],"user":"0","group":"0","workingDirectory":"rel"}`},
		{in: `{"exec":["x"],"user":"0","group":"0","supplementaryGIDs":[-4]}`},
		{in: `{"exec":["x"],"user":"0","group":"0"} {}`},
		{in: `[]`},
		{in: ``},
	} {
		t.Run(tc.in, func(t *testing.T) {
			s, err := ParseRunSettings([]byte(tc.in))
			if !tc.ok {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err %v, want Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.TTY != tc.tty {
				t.Errorf("tty %v", s.TTY)
			}
		})
	}
}

func TestAppDefinitionAndEnv(t *testing.T) {
	m := validManifest()
	for _, tc := range []struct {
		name      string
		override  *appc.App
		wantExec  []string
		wantUser  string
		wantEnvIn string
	}{
		{name: "image app", wantExec: []string{"/bin/web", "-v"}, wantUser: "1", wantEnvIn: "A=img"},
		{name: "override exec", override: &appc.App{Exec: []string{"/bin/other"}, Environment: []appc.EnvVar{{Name: "A", Value: "pod"}}},
			wantExec: []string{"/bin/other"}, wantUser: "1", wantEnvIn: "A=pod"},
		{name: "override keeps image exec", override: &appc.App{User: "9"}, wantExec: []string{"/bin/web", "-v"}, wantUser: "9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ra := m.Pod.Apps[0]
			ra.App = tc.override
			def, err := appDefinition(&m, ra)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(def.Exec, tc.wantExec) || def.User != tc.wantUser {
				t.Errorf("got %+v", def)
			}
			env := BuildEnv("web", Identity{Home: "/h"}, true, def.Environment)
			for _, want := range []string{"PATH=" + DefaultPath, "HOME=/h", "AC_APP_NAME=web", "TERM=xterm", tc.wantEnvIn} {
				if want != "" && !slices.Contains(env, want) {
					t.Errorf("env %v lacks %q", env, want)
				}
			}
		})
	}
	// No exec anywhere is an error.
	m.Images[testID] = appc.ImageManifest{ACKind: appc.KindImageManifest, Name: "x"}
	if _, err := appDefinition(&m, m.Pod.Apps[0]); !errors.Is(err, kerrors.Invalid) {
		t.Errorf("no exec: %v", err)
	}
}

func FuzzParseManifest(f *testing.F) {
	vm := validManifest()
	b, _ := json.Marshal(vm)
	f.Add(b)
	f.Add([]byte(`{"pod":{"acKind":"PodManifest","apps":[]}}`))
	f.Add([]byte(`{"stagerConfig":{"union":"copy","gracePeriod":"1s"}}`))
	f.Add([]byte(`{"stagerConfig":{"logMaxBytes":1024}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, cfg, err := ParseManifest(data)
		if err != nil {
			if m != nil {
				t.Fatal("manifest returned with an error")
			}
			return
		}
		// Whatever parses must be safe to turn into paths.
		for _, a := range m.Pod.Apps {
			if !appc.ValidACName(a.Name) || strings.Contains(AppRootfs(a.Name), "..") {
				t.Fatalf("unsafe app name %q accepted", a.Name)
			}
			for _, id := range m.AppImageOrder[a.Name] {
				if !appc.ValidImageID(id) {
					t.Fatalf("unsafe image id %q accepted", id)
				}
			}
		}
		if cfg.Grace() < 0 {
			t.Fatal("negative grace")
		}
		if cfg.LogMaxBytes != 0 && cfg.LogMaxBytes < MinLogMaxBytes {
			t.Fatalf("log size %d accepted", cfg.LogMaxBytes)
		}
	})
}

func FuzzParseRunSettings(f *testing.F) {
	f.Add([]byte(`{"exec":["/bin/sh"],"user":"0","group":"0","tty":true}`))
	f.Add([]byte(`{"exec":["sh","-c","x"],"user":"u","group":"g","supplementaryGIDs":[1],"workingDirectory":"/","environment":[{"name":"A","value":"b"}]}`))
	f.Add([]byte(`{"exec":[""]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseRunSettings(data)
		if err != nil {
			return
		}
		if len(s.Exec) == 0 || s.Exec[0] == "" || s.User == "" || s.Group == "" {
			t.Fatalf("invalid settings accepted: %+v", s)
		}
		for _, e := range s.Environment {
			if !appc.ValidEnvName(e.Name) {
				t.Fatalf("bad env name %q accepted", e.Name)
			}
		}
	})
}

func TestReadSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		close   bool
		wantErr error
	}{
		{name: "complete", data: `{"exec":["x"],"user":"0","group":"0"}`, close: true},
		{name: "no EOF in time", data: `{"exec":["x"],"user":"0","group":"0"}`, wantErr: kerrors.Timeout},
		{name: "partial", data: `{"exec":`, wantErr: kerrors.Timeout},
		{name: "too large", data: `{"exec":["` + strings.Repeat("a", maxSettings) + `"],"user":"0","group":"0"}`, close: true, wantErr: kerrors.Invalid},
		{name: "invalid", data: `{}`, close: true, wantErr: kerrors.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			defer w.Close()
			go func() {
				_, _ = w.WriteString(tc.data)
				if tc.close {
					w.Close()
				}
			}()
			begin := time.Now()
			_, err = ReadSettings(r, 200*time.Millisecond)
			if tc.wantErr == nil && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if time.Since(begin) > 2*time.Second {
				t.Errorf("took %v", time.Since(begin))
			}
		})
	}
}
