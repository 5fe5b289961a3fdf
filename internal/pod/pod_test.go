package pod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

func readState(t *testing.T, f *fixture, uuid string) map[string]any {
	t.Helper()
	// The stager's writes land in its overlay's upper folder (or in the
	// copied root).
	b, err := os.ReadFile(filepath.Join(f.opts.PodsDir, uuid, "stager.upper", "state.json"))
	if f.opts.CopyStagerRoot {
		b, err = os.ReadFile(filepath.Join(f.opts.PodsDir, uuid, "stager", "state.json"))
	}
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPodLifecycle checks a pod's life and what its stager finds (the
// stager spec's launch), with a stage-init spare and with a pre-started
// stager (prestart.go).
func TestPodLifecycle(t *testing.T) {
	for _, prestart := range []bool{false, true} {
		t.Run(map[bool]string{false: "stage-init", true: "pre-started"}[prestart], func(t *testing.T) {
			testPodLifecycle(t, prestart)
		})
	}
}

func testPodLifecycle(t *testing.T, prestart bool) {
	f := newFixtureWith(t, "with-child", prestart, nil)
	ctx := t.Context()
	warmID := ""
	if prestart {
		waitFor(t, "pre-started stager", 10*time.Second, func() bool { warmID = f.rt.warmID(); return warmID != "" })
	}
	hostDir := t.TempDir()
	spec := f.spec("kpod-life")
	roDir, yes := t.TempDir(), true
	spec.Volumes = []appc.Volume{{Name: "data", Kind: "empty"}, {Name: "host", Kind: "host", Source: hostDir}, {Name: "ro", Kind: "host", Source: roDir, ReadOnly: &yes}}
	spec.Apps[0].Mounts = []appc.Mount{{Volume: "data", Path: "/data"}}
	p, err := f.rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != Running || p.StagerPID == 0 || p.NetNS == "" || p.Apps[0].Name != "busybox" || p.Apps[0].ImageID != f.appID {
		t.Fatalf("unexpected pod %+v", p)
	}
	if prestart && p.UUID != warmID {
		t.Fatalf("pod %s did not take the pre-started stager %s", p.UUID, warmID)
	}
	st := readState(t, f, p.UUID)
	for k, want := range map[string]any{"proc": true, "sysRO": true, "cgroupOwn": true, "hostname": "kpod-life", "manifestName": "kpod-life"} {
		if st[k] != want {
			t.Errorf("stager saw %s = %v, want %v (state %v)", k, st[k], want, st)
		}
	}
	if ro := st["layersRO"].(map[string]any); ro[f.appID] != true {
		t.Errorf("layer not read-only in stager: %v", ro)
	}
	if v := st["volumes"].(map[string]any); v["data"] != true || v["host"] != true || v["ro"] != false {
		t.Errorf("stager's writes to volumes data, host, ro (read-only): %v", v)
	}
	if ifs := st["interfaces"].([]any); len(ifs) != 1 || ifs[0] != "lo" {
		t.Errorf("stager netns interfaces %v, want only lo", ifs)
	}
	if b, err := os.ReadFile(filepath.Join(hostDir, "from-stager")); err != nil || string(b) != "kpod-life" {
		t.Errorf("host volume not shared: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(f.opts.VolumesDir, p.UUID, "data", "from-stager")); err != nil {
		t.Errorf("empty volume not shared: %v", err)
	}
	var m stagerspec.Manifest
	b, _ := os.ReadFile(filepath.Join(f.opts.PodsDir, p.UUID, "stager.upper", "manifest"))
	if err := json.Unmarshal(b, &m); err != nil || m.Validate() != nil {
		t.Fatalf("manifest %s: %v", b, err)
	}
	var sc bytes.Buffer
	_ = json.Compact(&sc, m.StagerConfig)
	if m.AppImageOrder["busybox"][0] != f.appID || m.Pod.Apps[0].App.Exec[0] != "/bin/sleep" || sc.String() != `{"mode":"with-child"}` {
		t.Errorf("manifest content %s", b)
	}

	t.Run("get and list", func(t *testing.T) {
		for _, ref := range []string{p.UUID, p.Name, p.UUID[:8]} {
			g, err := f.rt.Get(ctx, ref)
			if err != nil || g.UUID != p.UUID {
				t.Errorf("Get(%q) = %v, %v", ref, g, err)
			}
		}
		if _, err := f.rt.Get(ctx, "kpod-nope"); !errors.Is(err, kerrors.NotFound) {
			t.Errorf("unknown pod: %v", err)
		}
		l, err := f.rt.List(ctx)
		if err != nil || len(l) != 1 {
			t.Errorf("List = %v, %v", l, err)
		}
	})
	t.Run("duplicate name", func(t *testing.T) {
		if _, err := f.rt.Create(ctx, f.spec("kpod-life")); !errors.Is(err, kerrors.Conflict) {
			t.Errorf("duplicate name: %v", err)
		}
	})
	t.Run("unknown network", func(t *testing.T) {
		s := f.spec("kpod-net")
		s.Networks = []string{"kpodnet"}
		if _, err := f.rt.Create(ctx, s); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("unknown network: %v", err)
		}
	})
	t.Run("remove running refused", func(t *testing.T) {
		if err := f.rt.Remove(ctx, p.UUID, false); !errors.Is(err, kerrors.Conflict) {
			t.Errorf("remove running: %v", err)
		}
	})
	t.Run("status", func(t *testing.T) {
		s, err := f.rt.Status(ctx, p.Name)
		if err != nil || s["busybox"].Exited || s["busybox"].PID == 0 {
			t.Errorf("status %v %v", s, err)
		}
	})
	t.Run("exec", func(t *testing.T) {
		for _, tc := range []struct {
			name       string
			tty        bool
			code       int
			out, errOu string
		}{
			{name: "plain", code: 7, out: "out\n", errOu: "err\n"},
			{name: "tty", tty: true, code: 7, out: "out\r\nerr\r\n"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var o, e bytes.Buffer
				code, err := f.rt.Exec(ctx, p.Name, "busybox", stagerspec.RunSettings{Exec: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}},
					IO{Stdout: &o, Stderr: &e, TTY: tc.tty})
				if err != nil || code != tc.code || o.String() != tc.out || e.String() != tc.errOu {
					t.Errorf("exec = %d, %v, out %q err %q", code, err, o.String(), e.String())
				}
			})
		}
		if _, err := f.rt.Exec(ctx, p.Name, "nope", stagerspec.RunSettings{Exec: []string{"/bin/true"}}, IO{}); !errors.Is(err, kerrors.NotFound) {
			t.Errorf("unknown app: %v", err)
		}
		if _, err := f.rt.Exec(ctx, p.Name, "busybox", stagerspec.RunSettings{}, IO{}); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("no exec: %v", err)
		}
	})
	t.Run("tty size", func(t *testing.T) {
		resize := make(chan TermSize, 1)
		resize <- TermSize{Rows: 33, Cols: 101}
		var o bytes.Buffer
		code, err := f.rt.Exec(ctx, p.Name, "busybox", stagerspec.RunSettings{Exec: []string{"/bin/busybox", "stty", "size"}},
			IO{Stdout: &o, TTY: true, Resize: resize})
		if err != nil || code != 0 || o.String() != "33 101\r\n" {
			t.Errorf("stty size = %d, %v, %q", code, err, o.String())
		}
	})
	t.Run("logs", func(t *testing.T) {
		var o bytes.Buffer
		if err := f.rt.Logs(ctx, p.Name, "busybox", false, &o); err != nil || o.String() != "log of busybox\n" {
			t.Errorf("logs %q %v", o.String(), err)
		}
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var fo bytes.Buffer
		if err := f.rt.Logs(fctx, p.Name, "busybox", true, &fo); err != nil || strings.Count(fo.String(), "line ") < 2 {
			t.Errorf("logs -f %q %v", fo.String(), err)
		}
	})
	t.Run("attach", func(t *testing.T) {
		var o bytes.Buffer
		if err := f.rt.Attach(ctx, p.Name, "busybox", IO{Stdin: strings.NewReader("hello\n"), Stdout: &o}); err != nil || o.String() != "hello\n" {
			t.Errorf("attach %q %v", o.String(), err)
		}
	})
	t.Run("stop", func(t *testing.T) {
		if err := f.rt.Stop(ctx, p.Name, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		g, _ := f.rt.Get(ctx, p.UUID)
		if g.State != Exited || g.Error != "" || g.Finished.IsZero() {
			t.Errorf("after stop: %+v", g)
		}
		if l := f.runtimeLeftovers(p.UUID, p.StagerPID); len(l) > 0 {
			t.Errorf("left after stop: %v", l)
		}
		if _, err := f.rt.Status(ctx, p.Name); !errors.Is(err, kerrors.Conflict) {
			t.Errorf("status of stopped pod: %v", err)
		}
		if err := f.rt.Stop(ctx, p.Name, time.Second); err != nil {
			t.Errorf("second stop: %v", err)
		}
	})
	t.Run("remove", func(t *testing.T) {
		if err := f.rt.Remove(ctx, p.Name, false); err != nil {
			t.Fatal(err)
		}
		if l := f.leftovers(p.UUID, p.StagerPID); len(l) > 0 {
			t.Errorf("left after remove: %v", l)
		}
		if _, err := f.rt.Get(ctx, p.UUID); !errors.Is(err, kerrors.NotFound) {
			t.Errorf("removed pod still found: %v", err)
		}
		if prestart {
			// Its successor holds a lease: closing undoes it.
			if err := f.rt.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if d := f.podDirs(t); len(d) > 0 {
				t.Errorf("folders left after close: %v", d)
			}
		}
		if n := f.store.leaseCount(); n != 0 {
			t.Errorf("%d leases left", n)
		}
		if b, err := os.ReadFile(filepath.Join(hostDir, "from-stager")); err != nil || len(b) == 0 {
			t.Errorf("host volume content lost on remove: %v", err)
		}
	})
}

// procsMentioning lists processes whose command line mentions s.
func procsMentioning(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, e.Name())
		}
	}
	return out
}

// assertNothingLeft checks that a failed create left no pod behind.
func assertNothingLeft(t *testing.T, f *fixture) {
	t.Helper()
	if d := f.podDirs(t); len(d) > 0 {
		t.Errorf("pod dirs left: %v", d)
	}
	if l, _ := f.rt.List(t.Context()); len(l) > 0 {
		t.Errorf("pods listed: %v", l)
	}
	mis, _ := readMountInfo()
	for _, m := range mis {
		if strings.HasPrefix(m.Point, f.opts.PodsDir) || strings.HasPrefix(m.Point, f.opts.VolumesDir) {
			t.Errorf("mount left: %s", m.Point)
		}
	}
	for _, cg := range f.rt.cgroups {
		ents, _ := os.ReadDir(filepath.Join(cg.Path, f.opts.CgroupRoot))
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup left: %s", filepath.Join(cg.Path, f.opts.CgroupRoot, e.Name()))
			}
		}
	}
	if p := procsMentioning(f.opts.PodsDir); len(p) > 0 {
		t.Errorf("processes left: %v", p)
	}
	if ents, _ := os.ReadDir(f.opts.VolumesDir); len(ents) > 0 {
		t.Errorf("volumes left: %d", len(ents))
	}
	if n := f.store.leaseCount(); n != 0 {
		t.Errorf("%d leases left", n)
	}
}

// TestCreateRollbackEachStep fails a create after each step, with a fresh
// stage-init and with a pre-started stager, and checks that nothing is
// left (the Runtime is closed first, so that no spare is in the way).
func TestCreateRollbackEachStep(t *testing.T) {
	for _, prestart := range []bool{false, true} {
		for _, name := range StepNames() {
			t.Run(map[bool]string{false: "fresh/", true: "pre-started/"}[prestart]+name, func(t *testing.T) {
				f := newFixtureWith(t, "normal", prestart, func(o *Options) { o.FailStep = name })
				if prestart {
					waitFor(t, "pre-started stager", 10*time.Second, func() bool { return f.rt.warmID() != "" })
				}
				spec := f.spec("kpod-fail")
				spec.Volumes = []appc.Volume{{Name: "data", Kind: "empty"}, {Name: "host", Kind: "host", Source: t.TempDir()}}
				_, err := f.rt.Create(t.Context(), spec)
				if err == nil || !strings.Contains(err.Error(), "failpoint after step "+name) {
					t.Fatalf("create error %v", err)
				}
				if err := f.rt.Close(t.Context()); err != nil {
					t.Fatal(err)
				}
				assertNothingLeft(t, f)
			})
		}
	}
}

func TestCreateFailures(t *testing.T) {
	tests := []struct {
		name    string
		mode    string
		tweak   func(*Options, *memStore)
		wantCat error
		wantMsg string
	}{
		{name: "never ready", mode: "never-ready", tweak: func(o *Options, _ *memStore) { o.ReadyTimeout = time.Second }, wantCat: kerrors.Timeout, wantMsg: "within 1s"},
		{name: "stager exits early", mode: "fail", wantMsg: "exited before it was ready"},
		{name: "untrusted stager", mode: "normal", wantCat: kerrors.Unauthorized, tweak: func(o *Options, s *memStore) {
			s.mu.Lock()
			s.imgs[s.refs[o.StagerImage]].signed = false
			s.mu.Unlock()
		}},
		{name: "dependent stager", mode: "normal", wantCat: kerrors.Unauthorized, wantMsg: "dependencies", tweak: func(o *Options, s *memStore) {
			s.mu.Lock()
			m := s.imgs[s.refs[o.StagerImage]]
			m.img.Manifest.Dependencies = []appc.Dependency{{ImageName: "x"}}
			s.mu.Unlock()
		}},
		{name: "bad stager exec", mode: "normal", wantMsg: "exec stager", tweak: func(o *Options, s *memStore) {
			s.mu.Lock()
			s.imgs[s.refs[o.StagerImage]].img.Manifest.App.Exec = []string{"/missing"}
			s.mu.Unlock()
		}},
		{name: "unknown app image", mode: "normal", wantCat: kerrors.Unavailable, tweak: func(o *Options, s *memStore) {
			s.mu.Lock()
			delete(s.refs, "file:///test/busybox.aci")
			s.mu.Unlock()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var store *memStore
			f := newFixture(t, tc.mode, func(o *Options) {
				store = o.Images.(*memStore)
				if tc.tweak != nil {
					tc.tweak(o, store)
				}
			})
			p, err := f.rt.Create(t.Context(), f.spec("kpod-bad"))
			if err == nil && tc.mode == "fail" {
				// Exiting closes fd 4 an instant before the process is
				// gone, so kurmad may take it for readiness; the pod must
				// then turn Errored and be torn down at once.
				waitFor(t, "pod errored", 10*time.Second, func() bool {
					g, err := f.rt.Get(t.Context(), p.UUID)
					return err == nil && g.State == Errored && strings.Contains(g.Error, "exit status 2")
				})
				if l := f.runtimeLeftovers(p.UUID, p.StagerPID); len(l) > 0 {
					t.Errorf("left: %v", l)
				}
				return
			}
			if err == nil {
				t.Fatal("create succeeded")
			}
			if tc.wantCat != nil && !errors.Is(err, tc.wantCat) {
				t.Errorf("error %v is not %v", err, tc.wantCat)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q lacks %q", err, tc.wantMsg)
			}
			assertNothingLeft(t, f)
		})
	}
}

func TestInvalidSpec(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
	}{
		{"no apps", Spec{Name: "a"}},
		{"bad name", Spec{Name: "a/b", Apps: []AppSpec{{Image: "x"}}}},
		{"no image", Spec{Apps: []AppSpec{{}}}},
		{"duplicate app", Spec{Apps: []AppSpec{{Name: "a", Image: "x"}, {Name: "a", Image: "y"}}}},
		{"bad app name", Spec{Apps: []AppSpec{{Name: "A_b", Image: "x"}}}},
		{"bad env", Spec{Apps: []AppSpec{{Image: "x", Env: []appc.EnvVar{{Name: "1x"}}}}}},
		{"unknown volume", Spec{Apps: []AppSpec{{Image: "x", Mounts: []appc.Mount{{Volume: "v", Path: "/v"}}}}}},
		{"relative mount", Spec{Volumes: []appc.Volume{{Name: "v", Kind: "empty"}}, Apps: []AppSpec{{Image: "x", Mounts: []appc.Mount{{Volume: "v", Path: "v"}}}}}},
		{"bad volume kind", Spec{Volumes: []appc.Volume{{Name: "v", Kind: "nfs"}}, Apps: []AppSpec{{Image: "x"}}}},
		{"relative host volume", Spec{Volumes: []appc.Volume{{Name: "v", Kind: "host", Source: "tmp"}}, Apps: []AppSpec{{Image: "x"}}}},
		{"missing host volume", Spec{Volumes: []appc.Volume{{Name: "v", Kind: "host", Source: "/nonexistent-kpod"}}, Apps: []AppSpec{{Image: "x"}}}},
		{"host plus network", Spec{Networks: []string{"host", "a"}, Apps: []AppSpec{{Image: "x"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := cloneSpec(tc.spec)
			if err := validateSpec(&s); !errors.Is(err, kerrors.Invalid) {
				t.Errorf("validateSpec = %v, want Invalid", err)
			}
		})
	}
	s := Spec{Apps: []AppSpec{{Image: "docker://reg/lib/Busy_box:1"}, {Image: "docker://reg/lib/Busy_box:2"}, {Image: "sha512-abc"}}}
	if err := validateSpec(&s); err != nil {
		t.Fatal(err)
	}
	if got := []string{s.Apps[0].Name, s.Apps[1].Name, s.Apps[2].Name}; strings.Join(got, ",") != "busy-box,busy-box-2,app" {
		t.Errorf("derived names %v", got)
	}
}

func TestStagerExitMarksErrored(t *testing.T) {
	f := newFixture(t, "exit-after-ready", nil)
	p, err := f.rt.Create(t.Context(), f.spec("kpod-exit"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod errored", 10*time.Second, func() bool {
		g, err := f.rt.Get(t.Context(), p.UUID)
		return err == nil && g.State == Errored
	})
	g, _ := f.rt.Get(t.Context(), p.UUID)
	if !strings.Contains(g.Error, "exit status 3") {
		t.Errorf("error %q", g.Error)
	}
	if l := f.runtimeLeftovers(p.UUID, p.StagerPID); len(l) > 0 {
		t.Errorf("left after stager exit: %v", l)
	}
}

func TestHostNetworkCopiedRoot(t *testing.T) {
	f := newFixture(t, "normal", func(o *Options) { o.CopyStagerRoot = true })
	spec := f.spec("kpod-hostnet")
	spec.Networks = []string{"host"}
	p, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if p.NetNS != "" {
		t.Errorf("host-network pod has netns %q", p.NetNS)
	}
	// Other tests add and remove host interfaces meanwhile: ask only that
	// the stager saw some non-loopback interface the host has.
	host, _ := os.ReadDir("/sys/class/net")
	st := readState(t, f, p.UUID)
	shared := 0
	for _, i := range st["interfaces"].([]any) {
		for _, h := range host {
			if i == h.Name() && i != "lo" {
				shared++
			}
		}
	}
	if shared == 0 {
		t.Errorf("stager sees %v, none of the host's interfaces", st["interfaces"])
	}
}

func TestRestartRecovery(t *testing.T) {
	f := newFixture(t, "normal", nil)
	ctx := t.Context()
	live, err := f.rt.Create(ctx, f.spec("kpod-live"))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := f.rt.Create(ctx, f.spec("kpod-dead"))
	if err != nil {
		t.Fatal(err)
	}
	half, err := f.rt.Create(ctx, f.spec("kpod-half"))
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := f.rt.Create(ctx, f.spec("kpod-stopped"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Stop(ctx, stopped.UUID, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// While "kurmad" is down: one stager dies, one record is left mid-create.
	if err := syscall.Kill(dead.StagerPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "stager gone", 5*time.Second, func() bool { _, err := procStartTime(dead.StagerPID); return err != nil })
	rec, err := readRecord(filepath.Join(f.opts.PodsDir, half.UUID))
	if err != nil {
		t.Fatal(err)
	}
	rec.Pod.State = Creating
	if err := writeRecord(filepath.Join(f.opts.PodsDir, half.UUID), rec, false); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(f.opts.PodsDir, "debris"), 0o700); err != nil {
		t.Fatal(err)
	}

	rt, err := New(ctx, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	g, err := rt.Get(ctx, live.UUID)
	if err != nil || g.State != Running || g.StagerPID != live.StagerPID {
		t.Fatalf("live pod after restart: %+v %v", g, err)
	}
	if s, err := rt.Status(ctx, live.UUID); err != nil || len(s) != 1 {
		t.Errorf("status after restart: %v %v", s, err)
	}
	g, err = rt.Get(ctx, dead.UUID)
	if err != nil || g.State != Errored || !strings.Contains(g.Error, "not running") {
		t.Errorf("dead pod after restart: %+v %v", g, err)
	}
	if l := f.runtimeLeftovers(dead.UUID, dead.StagerPID); len(l) > 0 {
		t.Errorf("dead pod left: %v", l)
	}
	if _, err := rt.Get(ctx, half.UUID); !errors.Is(err, kerrors.NotFound) {
		t.Errorf("half-made pod kept: %v", err)
	}
	if l := f.leftovers(half.UUID, half.StagerPID); len(l) > 0 {
		t.Errorf("half-made pod left: %v", l)
	}
	f.store.mu.Lock()
	_, leased := f.store.leases[half.UUID]
	f.store.mu.Unlock()
	if leased {
		t.Errorf("half-made pod's image lease kept")
	}
	if g, err := rt.Get(ctx, stopped.UUID); err != nil || g.State != Exited {
		t.Errorf("stopped pod after restart: %+v %v", g, err)
	}
	if d := f.podDirs(t); len(d) != 3 {
		t.Errorf("pod dirs after restart: %v", d)
	}
	if l, _ := rt.List(ctx); len(l) != 3 {
		t.Errorf("pods after restart: %d", len(l))
	}
	// The re-adopted stager is not our child: its exit is seen by pidfd.
	if err := rt.Stop(ctx, live.UUID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if g, _ := rt.Get(ctx, live.UUID); g.State != Exited {
		t.Errorf("re-adopted pod after stop: %+v", g)
	}
	if l := f.runtimeLeftovers(live.UUID, live.StagerPID); len(l) > 0 {
		t.Errorf("re-adopted pod left: %v", l)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	f := newFixture(t, "ignore-term", nil)
	ctx := t.Context()
	p, err := f.rt.Create(ctx, f.spec("kpod-stubborn"))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := f.rt.Stop(ctx, p.UUID, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("stop returned after %v, before the grace period", d)
	}
	g, _ := f.rt.Get(ctx, p.UUID)
	if g.State != Errored || !strings.Contains(g.Error, "killed") {
		t.Errorf("after stop: %s %q", g.State, g.Error)
	}
	if l := f.runtimeLeftovers(p.UUID, p.StagerPID); len(l) > 0 {
		t.Errorf("left: %v", l)
	}
}

func TestConcurrentCreates(t *testing.T) {
	f := newFixture(t, "normal", nil)
	ctx := t.Context()
	const n = 4
	errs := make(chan error, 2*n)
	for i := range 2 * n {
		go func() {
			name := fmt.Sprintf("kpod-c%d", i%n) // each name asked for twice
			_, err := f.rt.Create(ctx, f.spec(name))
			errs <- err
		}()
	}
	ok, conflicts := 0, 0
	for range 2 * n {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, kerrors.Conflict):
			conflicts++
		default:
			t.Errorf("create: %v", err)
		}
	}
	if ok != n || conflicts != n {
		t.Errorf("%d created, %d conflicts; want %d each", ok, conflicts, n)
	}
	l, _ := f.rt.List(ctx)
	if len(l) != n {
		t.Errorf("%d pods listed", len(l))
	}
	if d := f.podDirs(t); len(d) != n {
		t.Errorf("%d pod dirs", len(d))
	}
}
