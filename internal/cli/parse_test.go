package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestParseVolume(t *testing.T) {
	tr, fa := true, false
	tests := []struct {
		in   string
		vol  appc.Volume
		path string
		bad  bool
	}{
		{in: "/srv/data:/data", vol: appc.Volume{Name: "vol0", Kind: "host", Source: "/srv/data"}, path: "/data"},
		{in: "/srv/data/:/data/:ro", vol: appc.Volume{Name: "vol0", Kind: "host", Source: "/srv/data", ReadOnly: &tr}, path: "/data"},
		{in: "cache:/var/cache:rw", vol: appc.Volume{Name: "cache", Kind: "empty", ReadOnly: &fa}, path: "/var/cache"},
		{in: "/scratch", vol: appc.Volume{Name: "vol0", Kind: "empty"}, path: "/scratch"},
		{in: "cache:data", bad: true},
		{in: "Cache:/x", bad: true},
		{in: "a:/x:rx", bad: true},
		{in: ":/x", bad: true},
		{in: "a:/b:ro:x", bad: true},
		{in: "", bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			v, m, err := ParseVolume(tc.in, 0)
			if tc.bad {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err = %v, want Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Name != tc.vol.Name || v.Kind != tc.vol.Kind || v.Source != tc.vol.Source || (v.ReadOnly == nil) != (tc.vol.ReadOnly == nil) ||
				(v.ReadOnly != nil && *v.ReadOnly != *tc.vol.ReadOnly) || m.Path != tc.path || m.Volume != v.Name {
				t.Fatalf("got %+v %+v", v, m)
			}
		})
	}
}

func FuzzParseVolume(f *testing.F) {
	for _, s := range []string{"/a:/b", "/a:/b:ro", "name:/x", "/x", "a:b:c:d", ":", "x:/y:rw"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, m, err := ParseVolume(s, 3)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error not Invalid: %v", err)
			}
			return
		}
		pm := appc.PodManifest{ACKind: appc.KindPodManifest, Volumes: []appc.Volume{v},
			Apps: []appc.RuntimeApp{{Name: "a", Image: appc.RuntimeImage{ID: "sha512-" + strings.Repeat("0", 64)}, Mounts: []appc.Mount{m}}}}
		if err := pm.Validate(); err != nil {
			t.Fatalf("accepted %q gives an invalid pod: %v", s, err)
		}
	})
}

func TestParseEnv(t *testing.T) {
	t.Setenv("KAPI_FROM_ENV", "yes")
	got, err := ParseEnv([]string{"A=1", "B=", "C=x=y", "KAPI_FROM_ENV", "KAPI_UNSET_VAR"})
	if err != nil {
		t.Fatal(err)
	}
	want := "[{A 1} {B } {C x=y} {KAPI_FROM_ENV yes}]"
	if fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	for _, bad := range []string{"=x", "1A=2", "A B=1"} {
		if _, err := ParseEnv([]string{bad}); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("%q: err = %v, want Invalid", bad, err)
		}
	}
}

func TestBuildSpec(t *testing.T) {
	f := runFlags{name: "web", volumes: []string{"/tmp:/host", "data:/d1", "data:/d2"}, env: []string{"X=1"},
		nets: []string{"a,b", "c"}, user: "nobody:nogroup", tty: true, stager: "file:///s.aci"}
	spec, err := buildSpec(&f, []string{"busybox", "sh", "-c", "true"})
	if err != nil {
		t.Fatal(err)
	}
	a := spec.Apps[0]
	if spec.Name != "web" || len(spec.Volumes) != 2 || len(a.Mounts) != 3 || a.User != "nobody" || a.Group != "nogroup" ||
		!a.TTY || strings.Join(a.Exec, " ") != "sh -c true" || strings.Join(spec.Networks, ",") != "a,b,c" || spec.StagerImage != "file:///s.aci" {
		t.Fatalf("spec = %+v", spec)
	}
	if _, err := buildSpec(&runFlags{name: "bad name"}, []string{"busybox"}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := buildSpec(&runFlags{nets: []string{"a,,b"}}, []string{"busybox"}); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("bad net: %v", err)
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		err  error
		code int
	}{
		{nil, 0},
		{exitError{3}, 3},
		{fmt.Errorf("wrapped: %w", exitError{42}), 42},
		{kerrors.New(kerrors.NotFound, "no pod"), ExitError},
		{wire.ErrorBodyOf(&wire.ExitCodeError{Code: 127, Err: kerrors.New(kerrors.Invalid, "exec")}).Error.Err(), ExitNotFound},
		{fmt.Errorf("create: %w", &wire.ExitCodeError{Code: 126, Err: errors.New("not executable")}), ExitCannotExec},
		{kerrors.New(kerrors.Conflict, "busy"), ExitError},
		{errors.New("plain"), ExitError},
		{fmt.Errorf("stream: %w", context.Canceled), ExitInterrupted},
	}
	for _, tc := range tests {
		var b bytes.Buffer
		if got := exitCode(tc.err, &b); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

func TestCommandsWithoutDaemon(t *testing.T) {
	sock := t.TempDir() + "/none.sock"
	tests := []struct {
		args []string
		code int
	}{
		{[]string{"--socket", sock, "ps"}, ExitError},
		{[]string{"--socket", sock, "run", "--name", "a b", "busybox"}, ExitError},
		{[]string{"--socket", sock, "run", "-d", "--rm", "busybox"}, ExitError},
		{[]string{"completion", "bash"}, 0},
		{[]string{"--socket", sock, "exec", "onlypod"}, ExitError},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
			cmd := newRoot(e)
			cmd.SetArgs(tc.args)
			cmd.SetOut(&out)
			cmd.SetErr(&errb)
			if got := exitCode(cmd.ExecuteContext(t.Context()), &errb); got != tc.code {
				t.Fatalf("code %d, want %d; stderr %s", got, tc.code, errb.String())
			}
		})
	}
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, false)
	p.update(progressEv("sha256:aaaaaaaaaaaaaaaaaaaa", "fetching", 1, 10))
	p.update(progressEv("sha256:aaaaaaaaaaaaaaaaaaaa", "fetching", 5, 10))
	p.update(progressEv("sha256:aaaaaaaaaaaaaaaaaaaa", "done", 10, 10))
	if got := strings.Count(b.String(), "\n"); got != 2 {
		t.Fatalf("plain progress printed %d lines:\n%s", got, b.String())
	}
	b.Reset()
	p = newProgress(&b, true)
	p.update(progressEv("l1", "fetching", 1, 10))
	p.update(progressEv("l2", "fetching", 1, 10))
	p.update(progressEv("l1", "fetching", 10, 10))
	if !strings.Contains(b.String(), "\x1b[2A") || !strings.Contains(b.String(), "[==============================]") {
		t.Fatalf("terminal progress: %q", b.String())
	}
}

// TestBuildSpecValidates: the CLI refuses what the daemon would, with the
// one validator (podtypes.Spec.Validate).
func TestBuildSpecValidates(t *testing.T) {
	for _, nets := range [][]string{{"a,host"}, {"none", "b"}} {
		if _, err := buildSpec(&runFlags{nets: nets}, []string{"busybox"}); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("--net %v: err = %v, want Invalid", nets, err)
		}
	}
}
