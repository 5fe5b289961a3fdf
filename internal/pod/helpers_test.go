package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

// TestMain lets the test binary serve as kurmad for the stage-init re-exec.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == stageinit.Arg {
		os.Exit(stageinit.Main(os.Args[2:]))
	}
	if cfg := os.Getenv(helperEnv); cfg != "" {
		os.Exit(helperDaemon(cfg))
	}
	code := testutil.KeepHost(m)
	if stagerBin != "" {
		os.RemoveAll(filepath.Dir(stagerBin))
	}
	os.Exit(code)
}

var (
	stagerBinOnce sync.Once
	stagerBin     string
	stagerBinErr  error
)

// testStagerBin builds testdata/teststager once per test binary.
func testStagerBin(t *testing.T) string {
	t.Helper()
	stagerBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kpod-teststager-")
		if err != nil {
			stagerBinErr = err
			return
		}
		out := filepath.Join(dir, "stager")
		cmd := exec.Command("go", "build", "-o", out, "./testdata/teststager")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			stagerBinErr = fmt.Errorf("build teststager: %v\n%s", err, b)
			return
		}
		stagerBin = out
	})
	if stagerBinErr != nil {
		t.Fatal(stagerBinErr)
	}
	return stagerBin
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// busyboxRootfs makes a root filesystem with busybox and a few applets.
func busyboxRootfs(t *testing.T, dir string) {
	t.Helper()
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Skip("needs busybox-static (hack/apt-packages.txt)")
	}
	copyFile(t, bb, filepath.Join(dir, "bin", "busybox"), 0o755)
	for _, a := range []string{"sh", "echo", "cat", "sleep", "true", "false", "ls"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
}

// fixture is a Runtime on temporary folders with the test stager.
type fixture struct {
	rt     *Runtime
	opts   Options
	store  *memStore
	appRef string
	appID  string
	// the root filesystems behind the memStore's images
	stagerRoot, appRoot string
}

// fillStore adds the test stager (signed) and the busybox app image; IDs
// derive from the references, so another process gets the same ones.
func fillStore(store *memStore, stagerRef, sroot, aroot string, prestart bool) (appRef, appID string) {
	sm := appc.ImageManifest{
		ACKind: "ImageManifest", ACVersion: "0.8.11", Name: "kurma.dev/test-stager",
		App: &appc.App{Exec: []string{"/stager"}, User: "0", Group: "0"},
	}
	if prestart {
		sm.Annotations = []appc.Annotation{{Name: stagerspec.PrestartAnnotation, Value: "true"}}
	}
	store.add(stagerRef, sroot, sm, true)
	appRef = "file:///test/busybox.aci"
	appID = store.add(appRef, aroot, appc.ImageManifest{
		ACKind: "ImageManifest", ACVersion: "0.8.11", Name: "kurma.dev/busybox",
		App: &appc.App{Exec: []string{"/bin/sleep", "1000"}, User: "0", Group: "0"},
	}, false)
	return appRef, appID
}

// newFixture prepares a store holding the test stager (signed) and a
// busybox app image, and opens a Runtime with stagerConfig {"mode": mode}.
func newFixture(t *testing.T, mode string, tweak func(*Options)) *fixture {
	t.Helper()
	return newFixtureWith(t, mode, false, tweak)
}

// newFixtureWith is newFixture; prestart makes the test stager image
// declare stagerspec.PrestartAnnotation, so that the Runtime keeps a
// pre-started stager as its spare (prestart.go).
func newFixtureWith(t *testing.T, mode string, prestart bool, tweak func(*Options)) *fixture {
	t.Helper()
	if testing.Short() {
		t.Skip("root integration test (not in -short)")
	}
	testutil.RequireRoot(t)
	base := t.TempDir()
	store := newMemStore()

	sroot := filepath.Join(base, "stager-rootfs")
	bin := testStagerBin(t)
	copyFile(t, bin, filepath.Join(sroot, "stager"), 0o755)
	for _, c := range []string{"status", "run", "logs", "attach"} {
		copyFile(t, bin, filepath.Join(sroot, "opt", "stager", c), 0o755)
	}
	busyboxRootfs(t, sroot)
	stagerRef := "file:///test/kpod-stager.aci"
	aroot := filepath.Join(base, "app-rootfs")
	busyboxRootfs(t, aroot)
	appRef, appID := fillStore(store, stagerRef, sroot, aroot, prestart)

	cfg, _ := json.Marshal(map[string]string{"mode": mode})
	opts := Options{
		PodsDir:      filepath.Join(base, "pods"),
		VolumesDir:   filepath.Join(base, "volumes"),
		Images:       store,
		StagerImage:  stagerRef,
		StagerConfig: cfg,
		ReadyTimeout: 10 * time.Second,
		CgroupRoot:   testutil.UniqueName("kpod"),
	}
	if tweak != nil {
		tweak(&opts)
	}
	rt, err := New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup root %s", opts.CgroupRoot)
	f := &fixture{rt: rt, opts: opts, store: store, appRef: appRef, appID: appID, stagerRoot: sroot, appRoot: aroot}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pods, _ := f.rt.List(ctx)
		for _, p := range pods {
			if err := f.rt.Remove(ctx, p.UUID, true); err != nil {
				t.Errorf("cleanup: remove pod %s: %v", p.Name, err)
			}
		}
		_ = f.rt.Close(ctx)
		for _, cg := range rt.cgroups {
			root := filepath.Join(cg.Path, opts.CgroupRoot)
			if _, err := os.Stat(root); err == nil {
				t.Errorf("cleanup: Close left the empty cgroup root %s", root)
			}
			ents, _ := os.ReadDir(root)
			for _, e := range ents {
				if e.IsDir() {
					t.Errorf("cleanup: pod cgroup left: %s", filepath.Join(root, e.Name()))
				}
			}
			var err error
			for range 100 {
				if err = syscall.Rmdir(root); err == nil || errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EBUSY) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("cleanup: remove %s: %v", root, err)
			}
		}
		if err := unmountUnder(base); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return f
}

// reopen closes the Runtime without stopping pods and opens a new one on
// the same folders, as a restarted kurmad would.
func (f *fixture) reopen(t *testing.T) {
	t.Helper()
	if err := f.rt.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	rt, err := New(t.Context(), f.opts)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
}

func (f *fixture) spec(name string) Spec {
	return Spec{Name: name, Apps: []AppSpec{{Image: f.appRef}}}
}

// leftovers lists what a pod still holds on the host.
func (f *fixture) leftovers(uuid string, pid int) []string {
	var out []string
	dir := filepath.Join(f.opts.PodsDir, uuid)
	if mis, err := readMountInfo(); err == nil {
		for _, m := range mis {
			if strings.HasPrefix(m.Point, dir) || strings.HasPrefix(m.Point, filepath.Join(f.opts.VolumesDir, uuid)) {
				out = append(out, "mount "+m.Point)
			}
		}
	}
	for _, d := range []string{dir, filepath.Join(f.opts.VolumesDir, uuid)} {
		if _, err := os.Stat(d); err == nil {
			out = append(out, "dir "+d)
		}
	}
	for _, cg := range f.rt.cgroups {
		d := filepath.Join(cg.Path, f.opts.CgroupRoot, uuid)
		if _, err := os.Stat(d); err == nil {
			out = append(out, "cgroup "+d)
		}
	}
	if pid > 0 {
		if _, err := procStartTime(pid); err == nil {
			out = append(out, fmt.Sprintf("process %d", pid))
		}
	}
	return out
}

// runtimeLeftovers lists what a pod that is kept (ended, not removed) still
// holds: its folder may stay, but no mount, cgroup or process.
func (f *fixture) runtimeLeftovers(uuid string, pid int) []string {
	var out []string
	for _, l := range f.leftovers(uuid, pid) {
		if !strings.HasPrefix(l, "dir ") {
			out = append(out, l)
		}
	}
	return out
}

// podDirs lists the pod folders present, but for the one of a pre-started
// stager waiting for its pod (a record in state creating without a name).
func (f *fixture) podDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(f.opts.PodsDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Name() == trashDir {
			continue // removed pods, being deleted
		}
		if rec, err := readRecord(filepath.Join(f.opts.PodsDir, e.Name())); err == nil && rec.Pod.State == Creating && rec.Pod.Name == "" {
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
