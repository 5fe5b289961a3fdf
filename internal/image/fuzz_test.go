package image_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func FuzzParseACIManifest(f *testing.F) {
	f.Add([]byte(`{"acKind":"ImageManifest","acVersion":"0.8.11","name":"kurma.dev/x"}`))
	f.Add([]byte(`{"acKind":"ImageManifest","acVersion":"0.8.11","name":"x","app":{"exec":["/a"],"user":"0","group":"0","environment":[{"name":"A","value":"1"}]},"dependencies":[{"imageName":"b","imageID":"sha512-00000000000000000000000000000000"}]}`))
	f.Add([]byte(`{"acKind":"ImageManifest","name":"x","dependencies":[{"imageName":"b","imageID":"../../etc"}]}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := image.ParseACIManifest(data)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error %v is not Invalid", err)
			}
			return
		}
		if m.ACKind != appc.KindImageManifest || strings.TrimSpace(m.Name) == "" {
			t.Fatalf("accepted manifest %+v", m)
		}
		for _, d := range m.Dependencies {
			if d.ImageID != "" && !appc.ValidImageID(d.ImageID) {
				t.Fatalf("accepted dependency ID %q", d.ImageID)
			}
		}
	})
}

func FuzzConvertOCIConfig(f *testing.F) {
	f.Add([]byte(`{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/a"],"Cmd":["b"],"Env":["A=1"],"User":"1:2","WorkingDir":"/w","ExposedPorts":{"80/tcp":{}},"Labels":{"k":"v"}},"rootfs":{"type":"layers","diff_ids":[]}}`), "tag")
	f.Add([]byte(`{"config":{"User":":","Env":["=x"],"ExposedPorts":{"99999/tcp":{}}}}`), "")
	f.Add([]byte(`{"config":{"WorkingDir":"rel","ExposedPorts":{"53/udp":{},"x/y":{}}}}`), "v")
	f.Fuzz(func(t *testing.T, data []byte, tag string) {
		cf, err := v1.ParseConfigFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		m, err := image.ConvertOCIConfig(cf, "kurma.dev/fuzz", tag, "docker://x/y")
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error %v is not Invalid", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("converted manifest invalid: %v", err)
		}
		if m.App != nil {
			if m.App.WorkingDirectory != "" && !strings.HasPrefix(m.App.WorkingDirectory, "/") {
				t.Fatalf("relative working directory %q", m.App.WorkingDirectory)
			}
			for _, p := range m.App.Ports {
				if p.Port == 0 || p.Port > 65535 || !appc.ValidACName(p.Name) {
					t.Fatalf("bad port %+v", p)
				}
			}
		}
	})
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"docker:///library/busybox:latest", "docker://127.0.0.1:5000/a/b:c", "docker://r/a@sha256:" + strings.Repeat("a", 64),
		"file:///x/y.aci", "file://rel", "/abs/path", "http://h/x.aci", "https://h:1/x?y#z", "ftp://x", "", "docker://", "file:///"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := image.ParseURI(s, false)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error %v is not Invalid", err)
			}
			return
		}
		switch u.Scheme {
		case image.SchemeFile:
			if !strings.HasPrefix(u.Path, "/") || strings.Contains(u.Path, "/../") || u.Canonical != "file://"+u.Path {
				t.Fatalf("file URI %q parsed as %+v", s, u)
			}
		case image.SchemeDocker:
			if u.Ref == nil || !strings.HasPrefix(u.Canonical, "docker://") {
				t.Fatalf("docker URI %q parsed as %+v", s, u)
			}
		case image.SchemeHTTP, image.SchemeHTTPS:
			if !strings.HasPrefix(u.Canonical, u.Scheme+"://") {
				t.Fatalf("http URI %q parsed as %+v", s, u)
			}
		default:
			t.Fatalf("scheme %q", u.Scheme)
		}
		// The canonical form is a fixed point.
		u2, err := image.ParseURI(u.Canonical, false)
		if err != nil || u2.Canonical != u.Canonical {
			t.Fatalf("canonical %q reparsed as %q, %v", u.Canonical, u2.Canonical, err)
		}
	})
}

func TestParseURI(t *testing.T) {
	tests := []struct{ in, want string }{
		{"docker:///user/name:tag", "docker://index.docker.io/user/name:tag"},
		{"docker:///busybox", "docker://index.docker.io/library/busybox:latest"},
		{"docker://127.0.0.1:5000/repo:1", "docker://127.0.0.1:5000/repo:1"},
		{"file:///a/../b.aci", "file:///b.aci"},
		{"/x/y.aci", "file:///x/y.aci"},
		{"https://h/x.aci#frag", "https://h/x.aci"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			u, err := image.ParseURI(tc.in, false)
			if err != nil || u.Canonical != tc.want {
				t.Fatalf("ParseURI(%q) = %q, %v; want %q", tc.in, u.Canonical, err, tc.want)
			}
		})
	}
}
