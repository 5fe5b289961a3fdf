package pod

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// realImages builds, with the real kurma-acbuild, a signed image of the
// real default stager, an unsigned copy, a dependent stager and a busybox
// app image, and opens the real image store trusting the signing key.
type realImages struct {
	store                                *image.FSStore
	stager, unsigned, dependent, busybox string
}

func acbuild(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(testutil.Bin(t, "kurma-acbuild"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kurma-acbuild %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func newRealImages(t *testing.T) *realImages {
	t.Helper()
	if testing.Short() {
		t.Skip("root integration test (not in -short)")
	}
	testutil.RequireRoot(t)
	dir := t.TempDir()
	stager := testutil.Bin(t, "kurma-stager")
	acbuild(t, "keygen", "-o", filepath.Join(dir, "stager"))
	// Like the image `make` builds, it may be pre-started (prestart.go):
	// the tests below run the real stager that way; pods with host
	// networking start it the usual way.
	stagerArgs := []string{"--name", "kurma.dev/stager", "--exec", "/stager",
		"--annotation", stagerspec.PrestartAnnotation + "=true", "--add", stager + ":/stager"}
	for _, c := range []string{"status", "run", "logs", "attach"} {
		stagerArgs = append(stagerArgs, "--add", stager+":/opt/stager/"+c)
	}
	ri := &realImages{
		stager:    filepath.Join(dir, "stager.aci"),
		unsigned:  filepath.Join(dir, "unsigned.aci"),
		dependent: filepath.Join(dir, "dependent.aci"),
		busybox:   filepath.Join(dir, "busybox.aci"),
	}
	acbuild(t, append([]string{"build", "-o", ri.stager}, stagerArgs...)...)
	acbuild(t, "sign", "--key", filepath.Join(dir, "stager.key"), ri.stager)
	acbuild(t, append([]string{"build", "-o", ri.unsigned, "--label", "v=unsigned"}, stagerArgs...)...)
	acbuild(t, append([]string{"build", "-o", ri.dependent, "--dep", "kurma.dev/busybox"}, stagerArgs...)...)
	acbuild(t, "sign", "--key", filepath.Join(dir, "stager.key"), ri.dependent)
	root := filepath.Join(dir, "bb")
	busyboxRootfs(t, root)
	for _, a := range []string{"ps", "mkdir"} {
		if err := exec.Command("ln", "-s", "busybox", filepath.Join(root, "bin", a)).Run(); err != nil {
			t.Fatal(err)
		}
	}
	acbuild(t, "build", "-o", ri.busybox, "--name", "kurma.dev/busybox", "--exec", "/bin/sleep 1000",
		"--env", "PATH=/bin", "--add", filepath.Join(root, "bin")+":/bin")
	kr, err := trust.LoadKeyring(filepath.Join(dir, "stager.pub"))
	if err != nil {
		t.Fatal(err)
	}
	ri.store, err = image.Open(t.Context(), filepath.Join(dir, "images"), image.Options{Keyring: kr})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []*string{&ri.stager, &ri.unsigned, &ri.dependent, &ri.busybox} {
		_ = i
		*p = "file://" + *p
	}
	return ri
}

func newRealFixture(t *testing.T, ri *realImages) *fixture {
	t.Helper()
	return newFixture(t, "", func(o *Options) {
		o.Images = ri.store
		o.StagerImage = ri.stager
		o.StagerConfig = nil
		o.ReadyTimeout = 30 * time.Second
	})
}

func execOut(t *testing.T, f *fixture, pod, app string, argv ...string) (string, int) {
	t.Helper()
	var o, e bytes.Buffer
	code, err := f.rt.Exec(t.Context(), pod, app, stagerspec.RunSettings{Exec: argv}, IO{Stdout: &o, Stderr: &e})
	if err != nil {
		t.Fatalf("exec %v in %s/%s: %v", argv, pod, app, err)
	}
	return o.String() + e.String(), code
}

// TestRealStager runs pods with the real default stager and image store.
func TestRealStager(t *testing.T) {
	ri := newRealImages(t)
	f := newRealFixture(t, ri)
	f.store = newMemStore() // leases are the real store's business here
	ctx := t.Context()

	spec := Spec{
		Name:    "kpod-real",
		Volumes: []appc.Volume{{Name: "data", Kind: "empty"}},
		Apps: []AppSpec{
			{Name: "one", Image: ri.busybox, Mounts: []appc.Mount{{Volume: "data", Path: "/data"}}},
			{Name: "two", Image: ri.busybox, Exec: []string{"/bin/sleep", "2000"}, Mounts: []appc.Mount{{Volume: "data", Path: "/data"}}},
			{Name: "quits", Image: ri.busybox, Exec: []string{"/bin/sh", "-c", "exit 4"}},
		},
	}
	p, err := f.rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("shared pid namespace", func(t *testing.T) {
		out, code := execOut(t, f, p.Name, "two", "/bin/ps")
		if code != 0 || !strings.Contains(out, "sleep 1000") || !strings.Contains(out, "sleep 2000") {
			t.Errorf("ps in app two (exit %d):\n%s", code, out)
		}
	})
	t.Run("stager is the pod's init", func(t *testing.T) {
		// PID 1 of the pod's PID namespace is the stager itself (no
		// separate init process), and signals an app may send it that Go
		// would die of are dropped.
		out, code := execOut(t, f, p.Name, "one", "/bin/sh", "-c", "kill -HUP 1; kill -USR1 1; kill -QUIT 1; sleep 1; cat /proc/1/comm; ps; echo end")
		if code != 0 || !strings.HasPrefix(out, "stager\n") {
			t.Fatalf("exec (exit %d):\n%s", code, out)
		}
		if g, _ := f.rt.Get(ctx, p.Name); g.State != Running {
			t.Fatalf("pod after signals to its PID 1: %s %s", g.State, g.Error)
		}
		var ns [2]string
		for i, pid := range []string{strconv.Itoa(p.StagerPID), "self"} {
			if ns[i], err = os.Readlink("/proc/" + pid + "/ns/pid"); err != nil {
				t.Fatal(err)
			}
		}
		if ns[0] == ns[1] {
			t.Errorf("stager shares the host's PID namespace %s", ns[0])
		}
	})
	t.Run("loopback up", func(t *testing.T) {
		// stage-init brings lo up in the pod's new network namespace.
		out, code := execOut(t, f, p.Name, "one", "/bin/cat", "/sys/class/net/lo/flags")
		if code != 0 || strings.TrimSpace(out) != "0x9" {
			t.Errorf("lo flags (exit %d): %q, want 0x9 (up, loopback)", code, out)
		}
	})
	t.Run("shared volume", func(t *testing.T) {
		if out, code := execOut(t, f, p.Name, "one", "/bin/sh", "-c", "echo shared > /data/f"); code != 0 {
			t.Fatalf("write: %d %s", code, out)
		}
		if out, code := execOut(t, f, p.Name, "two", "/bin/cat", "/data/f"); code != 0 || out != "shared\n" {
			t.Errorf("read: %d %q", code, out)
		}
	})
	t.Run("exit code", func(t *testing.T) {
		if out, code := execOut(t, f, p.Name, "one", "/bin/sh", "-c", "echo hi; exit 5"); code != 5 || out != "hi\n" {
			t.Errorf("exec: %d %q", code, out)
		}
	})
	t.Run("status", func(t *testing.T) {
		st, err := f.rt.Status(ctx, p.Name)
		if err != nil || len(st) != 3 || st["one"].Exited || st["one"].PID == 0 {
			t.Errorf("status %+v %v", st, err)
		}
	})
	t.Run("stop and remove", func(t *testing.T) {
		if err := f.rt.Stop(ctx, p.Name, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		g, _ := f.rt.Get(ctx, p.Name)
		if g.State != Exited {
			t.Errorf("after stop: %+v", g)
		}
		for _, a := range g.Apps {
			if a.Status == nil || !a.Status.Exited {
				t.Errorf("app %s status after stop: %+v", a.Name, a.Status)
			}
		}
		if q := g.Apps[2].Status; q == nil || q.ExitCode == nil || *q.ExitCode != 4 {
			t.Errorf("exit status of app quits not kept: %+v", q)
		}
		if err := f.rt.Remove(ctx, p.Name, false); err != nil {
			t.Fatal(err)
		}
		if l := f.leftovers(p.UUID, p.StagerPID); len(l) > 0 {
			t.Errorf("left: %v", l)
		}
	})
	t.Run("untrusted stagers refused", func(t *testing.T) {
		for _, ref := range []string{ri.unsigned, ri.dependent} {
			s := Spec{Name: "kpod-untrusted", StagerImage: ref, Apps: []AppSpec{{Image: ri.busybox}}}
			_, err := f.rt.Create(ctx, s)
			if !errors.Is(err, kerrors.Unauthorized) {
				t.Errorf("stager %s: %v, want Unauthorized", ref, err)
			}
			if d := f.podDirs(t); len(d) > 0 {
				t.Errorf("pod dirs left: %v", d)
			}
		}
	})
	_ = context.Background
}
