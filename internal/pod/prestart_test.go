package pod

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

// TestPrestartEnvName: stage-init spells the variable out (it links no
// stagerspec); the two must agree.
func TestPrestartEnvName(t *testing.T) {
	if stageinit.PrestartEnv != stagerspec.PrestartEnv {
		t.Fatalf("stageinit.PrestartEnv %q != stagerspec.PrestartEnv %q", stageinit.PrestartEnv, stagerspec.PrestartEnv)
	}
}

// TestVolumePropagation mounts something under a shared host volume
// after the pod started: only a pod that asked for volumePropagation sees
// it, whether its stager was pre-started (binds attached on the host, which
// propagate into the stager) or started by stage-init (binds made inside).
// Layers stay read-only either way.
func TestVolumePropagation(t *testing.T) {
	for _, tc := range []struct {
		prestart, slave bool
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("prestart_%v_propagation_%v", tc.prestart, tc.slave), func(t *testing.T) {
			f := newFixtureWith(t, "normal", tc.prestart, nil)
			ctx := t.Context()
			warmID := ""
			if tc.prestart {
				waitFor(t, "pre-started stager", 10*time.Second, func() bool { warmID = f.rt.warmID(); return warmID != "" })
			}
			src := t.TempDir()
			if err := unix.Mount(src, src, "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(src, unix.MNT_DETACH) })
			if err := unix.Mount("", src, "", unix.MS_SHARED, ""); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(src, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			spec := f.spec("kpod-prop")
			spec.VolumePropagation = tc.slave
			spec.Volumes = []appc.Volume{{Name: "hv", Kind: "host", Source: src}}
			p, err := f.rt.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if tc.prestart && p.UUID != warmID {
				t.Fatalf("pod %s did not take the pre-started stager %s", p.UUID, warmID)
			}
			later := filepath.Join(src, "sub")
			if err := unix.Mount("kpod-prop", later, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(later, unix.MNT_DETACH) })
			if err := os.WriteFile(filepath.Join(later, "marker"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			var o bytes.Buffer
			code, err := f.rt.Exec(ctx, p.Name, "busybox", stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c",
				"test -e /volumes/hv/sub/marker && echo seen; touch /layers/" + f.appID + "/x 2>/dev/null && echo layer-writable; true"}}, IO{Stdout: &o, Stderr: &o})
			if err != nil || code != 0 {
				t.Fatalf("exec: %d %v %s", code, err, o.String())
			}
			want := ""
			if tc.slave {
				want = "seen\n"
			}
			if o.String() != want {
				t.Errorf("inside the stager: %q, want %q", o.String(), want)
			}
			if err := f.rt.Remove(ctx, p.UUID, true); err != nil {
				t.Fatal(err)
			}
			if l := f.leftovers(p.UUID, p.StagerPID); len(l) > 0 {
				t.Errorf("left after remove: %v", l)
			}
		})
	}
}
