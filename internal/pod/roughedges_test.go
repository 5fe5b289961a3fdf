package pod

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
)

// hostNetNSWithVeth makes a named netns on the host holding one end of a
// veth pair whose other end (returned) stays in the host namespace: the
// host end disappears exactly when the namespace is destroyed.
func hostNetNSWithVeth(t *testing.T) (nsPath, hostEnd string) {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	nsPath = n.Path()
	hostEnd = testutil.UniqueName("krp")
	peer := testutil.UniqueName("krp")
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutil.RemoveNetNS(nsPath)
		if l, err := netlink.LinkByName(hostEnd); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostEnd}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	pl, err := netlink.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(pl, int(n.Fd())); err != nil {
		t.Fatalf("move veth peer: %v", err)
	}
	// Only the bind mount may keep the namespace alive.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	return nsPath, hostEnd
}

// TestRealStagerRoughEdges covers the pod runtime's edges with the real
// default stager: the stager's mount namespace does not pin host mounts
// (pivot_root), AppSpec.TTY reaches the stager, and the logs of a stopped
// pod are read from its folder.
func TestRealStagerRoughEdges(t *testing.T) {
	ri := newRealImages(t)
	for _, tc := range []struct {
		name     string
		copyRoot bool
	}{{"overlay root", false}, {"copied root", true}} {
		t.Run(tc.name, func(t *testing.T) { roughEdges(t, ri, tc.copyRoot) })
	}
}

func roughEdges(t *testing.T, ri *realImages, copyRoot bool) {
	f := newFixture(t, "", func(o *Options) {
		o.Images = ri.store
		o.StagerImage = ri.stager
		o.StagerConfig = nil
		o.ReadyTimeout = 30 * time.Second
		o.CopyStagerRoot = copyRoot
		o.Network = resolvNet{}
	})
	f.store = newMemStore()
	ctx := t.Context()

	// Made before the pod starts, so a chrooted stager would hold a copy
	// of its bind mount under /run/netns.
	nsPath, hostEnd := hostNetNSWithVeth(t)

	spec := Spec{
		Name:    "kpod-edges",
		Volumes: []appc.Volume{{Name: "data", Kind: "empty"}},
		Apps: []AppSpec{
			{Name: "term", Image: ri.busybox, TTY: true, Mounts: []appc.Mount{{Volume: "data", Path: "/data"}},
				Exec: []string{"/bin/sh", "-c", "if [ -t 0 ] && [ -t 1 ]; then echo yes > /data/tty; else echo no > /data/tty; fi; exec sleep 1000"}},
			{Name: "cat", Image: ri.busybox, Exec: []string{"/bin/cat"}},
			{Name: "cat2", Image: ri.busybox, Exec: []string{"/bin/cat"}},
			{Name: "talk", Image: ri.busybox, Mounts: []appc.Mount{{Volume: "data", Path: "/data"}},
				Exec: []string{"/bin/sh", "-c", "echo hello-from-talk; echo to-stderr >&2; sleep 1000"}},
		},
	}
	p, err := f.rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("host mounts not pinned", func(t *testing.T) {
		mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", p.StagerPID))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(mi)), "\n") {
			fs := strings.Fields(line)
			if len(fs) > 4 && fs[4] == "/" && fs[3] != "/" && !strings.Contains(fs[3], p.UUID) {
				t.Errorf("stager root is a host subtree, not the pod's own: %s", line)
			}
		}
		// Unmount the namespace on the host (without unlinking its file,
		// which on current kernels would detach every copy anyway): it
		// must really go, taking the veth with it, unless some other mount
		// namespace still holds a copy of the host's mounts.
		if err := unix.Unmount(nsPath, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		gone := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := netlink.LinkByName(hostEnd); err != nil {
				gone = true
				break
			}
		}
		if !gone {
			t.Errorf("netns deleted on the host is kept alive by pod %s (veth %s still there)", p.Name, hostEnd)
		}
	})
	t.Run("call-ins still work", func(t *testing.T) {
		if out, code := execOut(t, f, p.Name, "talk", "/bin/sh", "-c", "echo ok"); code != 0 || out != "ok\n" {
			t.Errorf("exec: %d %q", code, out)
		}
	})
	t.Run("files written into the root before start reach the apps", func(t *testing.T) {
		if out, code := execOut(t, f, p.Name, "talk", "/bin/cat", "/etc/resolv.conf"); code != 0 || out != resolvConf {
			t.Errorf("resolv.conf in app: %d %q", code, out)
		}
	})
	t.Run("tty reaches the app", func(t *testing.T) {
		var out string
		waitFor(t, "tty probe", 10*time.Second, func() bool {
			out, _ = execOut(t, f, p.Name, "talk", "/bin/cat", "/data/tty")
			return out != ""
		})
		if out != "yes\n" {
			t.Errorf("app with TTY: stdin/stdout terminal? %q", out)
		}
	})
	t.Run("attach closes stdin only when asked", func(t *testing.T) {
		for _, tc := range []struct {
			app        string
			closeStdin bool
		}{{"cat", true}, {"cat2", false}} {
			if st, _ := f.rt.Status(ctx, p.Name); st[tc.app].Exited {
				t.Fatalf("app %s exited before attach: %+v", tc.app, st[tc.app])
			}
			limit := 10 * time.Second
			if !tc.closeStdin {
				limit = time.Second // attach stays until the caller leaves
			}
			actx, cancel := context.WithTimeout(ctx, limit)
			var out bytes.Buffer
			err := f.rt.Attach(actx, p.Name, tc.app, IO{Stdin: strings.NewReader("x\n"), Stdout: &out, CloseStdin: tc.closeStdin})
			cancel()
			st, serr := f.rt.Status(ctx, p.Name)
			// The app's output ends as it exits; its reaping may come a
			// moment later on a busy machine.
			for deadline := time.Now().Add(2 * time.Second); serr == nil && tc.closeStdin && !st[tc.app].Exited && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
				st, serr = f.rt.Status(ctx, p.Name)
			}
			if serr != nil {
				t.Fatal(serr)
			}
			if tc.closeStdin && (err != nil || out.String() != "x\n" || !st[tc.app].Exited) {
				t.Errorf("attach -close-stdin to cat: err %v out %q status %+v", err, out.String(), st[tc.app])
			}
			if !tc.closeStdin && st[tc.app].Exited {
				t.Errorf("attach without -close-stdin ended cat: %+v", st[tc.app])
			}
		}
	})
	t.Run("wait settled", func(t *testing.T) {
		start := time.Now()
		if st, ok := f.rt.WaitSettled(ctx, p.Name, 200*time.Millisecond); ok {
			t.Fatalf("settled while apps run: %+v", st)
		}
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Errorf("WaitSettled returned after %v, before its time", d)
		}
		q, err := f.rt.Create(ctx, Spec{Name: "kpod-settle", Apps: []AppSpec{{Image: ri.busybox, Exec: []string{"/bin/sh", "-c", "sleep 0.3; exit 6"}}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.rt.Remove(ctx, q.UUID, true) })
		start = time.Now()
		st, ok := f.rt.WaitSettled(ctx, q.UUID, 10*time.Second)
		if !ok || len(st) != 1 {
			t.Fatalf("WaitSettled: %v %+v after %v", ok, st, time.Since(start))
		}
		for _, as := range st {
			if as.ExitCode == nil || *as.ExitCode != 6 {
				t.Errorf("exit status %+v, want 6", as)
			}
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("WaitSettled took %v", d)
		}
		var b bytes.Buffer
		if err := f.rt.Logs(ctx, q.UUID, q.Apps[0].Name, false, &b); err != nil || b.Len() != 0 {
			t.Errorf("logs of a silent app: %v %q", err, b.String())
		}
	})
	t.Run("logs of a stopped pod", func(t *testing.T) {
		waitFor(t, "app output", 10*time.Second, func() bool {
			var b bytes.Buffer
			_ = f.rt.Logs(ctx, p.Name, "talk", false, &b)
			return strings.Contains(b.String(), "to-stderr")
		})
		if err := f.rt.Stop(ctx, p.Name, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := f.rt.Logs(ctx, p.Name, "talk", false, &b); err != nil {
			t.Fatalf("logs of stopped pod: %v", err)
		}
		if !strings.Contains(b.String(), "hello-from-talk\n") || !strings.Contains(b.String(), "to-stderr\n") {
			t.Errorf("logs of stopped pod: %q", b.String())
		}
		if err := f.rt.Logs(ctx, p.Name, "nosuch", false, &b); err == nil {
			t.Error("logs of an unknown app of a stopped pod: no error")
		}
	})
	if err := f.rt.Remove(ctx, p.Name, true); err != nil {
		t.Fatal(err)
	}
	if l := f.leftovers(p.UUID, p.StagerPID); len(l) > 0 {
		t.Errorf("left: %v", l)
	}
}

const resolvConf = "nameserver 192.0.2.53\n"

// resolvNet is a Networker that, like the network manager, writes the
// pod's resolv.conf into the stager root's writable layer on the host
// while the stager waits for its go-ahead.
type resolvNet struct{}

func (resolvNet) Attach(ctx context.Context, p *Pod) ([]json.RawMessage, error) {
	dir := filepath.Dir(p.NetNS)
	for _, root := range []string{"stager.upper", "stager"} {
		r := filepath.Join(dir, root)
		if fi, err := os.Lstat(r); err != nil || !fi.IsDir() {
			continue
		}
		if err := os.MkdirAll(filepath.Join(r, "etc"), 0o755); err != nil {
			return nil, err
		}
		return nil, os.WriteFile(filepath.Join(r, "etc", "resolv.conf"), []byte(resolvConf), 0o644)
	}
	return nil, fmt.Errorf("no stager root beside %s", p.NetNS)
}

func (resolvNet) Detach(ctx context.Context, p *Pod) error { return nil }

// TestSpareDoesNotPinHostMounts: an idle warm spare holds a copy of the
// host's mount namespace; a host mount under a private parent that existed
// when the spare started (here a network namespace's bind) must not stay
// alive in that copy once the host unmounts it.
func TestSpareDoesNotPinHostMounts(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("root integration test (not in -short)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	nsPath, hostEnd := hostNetNSWithVeth(t)
	private := filepath.Join(dir, "ns")
	if err := os.WriteFile(private, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(nsPath, private, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(private, unix.MNT_DETACH) })
	// Only the private bind keeps the namespace alive now.
	if err := testutil.RemoveNetNS(nsPath); err != nil {
		t.Fatal(err)
	}

	f := newFixture(t, "", nil)
	waitFor(t, "a warm spare", 10*time.Second, func() bool {
		f.rt.spareMu.Lock()
		defer f.rt.spareMu.Unlock()
		return f.rt.spare != nil
	})
	if err := unix.Unmount(private, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the namespace to go (veth "+hostEnd+")", 5*time.Second, func() bool {
		_, err := netlink.LinkByName(hostEnd)
		return err != nil
	})
	// And a new spare replaces the retired one.
	waitFor(t, "a new warm spare", 10*time.Second, func() bool {
		f.rt.spareMu.Lock()
		defer f.rt.spareMu.Unlock()
		return f.rt.spare != nil
	})
}

// TestSpareKnowsItsOwnMounts: what a spare holds is read from its own
// mount table, so a host mount made after it started (as a pod's netns
// bind is, while the next spare starts) is not counted as held, and its
// unmount does not retire the spare.
func TestSpareKnowsItsOwnMounts(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("root integration test (not in -short)")
	}
	f := newFixture(t, "", nil)
	p, err := f.rt.spawn(stageinit.SpareArg, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.abandon)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })

	held, err := mountKeys(strconv.Itoa(p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	host, err := mountKeys("self")
	if err != nil {
		t.Fatal(err)
	}
	var late string
	for k := range host {
		if strings.HasSuffix(k, " "+dir) {
			late = k
		}
	}
	if late == "" {
		t.Fatalf("the host's table lacks the new mount at %s", dir)
	}
	if held[late] != 0 {
		t.Fatalf("the spare is said to hold %q, mounted after it started", late)
	}
	if staleSpare(held, host) {
		t.Fatal("a fresh spare is stale against the host's current table")
	}
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	after, err := mountKeys("self")
	if err != nil {
		t.Fatal(err)
	}
	if staleSpare(held, after) {
		t.Fatal("unmounting a mount the spare never had makes it stale")
	}
	// A mount it does hold, gone from the host, makes it stale.
	for k := range held {
		after[k]--
		if !staleSpare(held, after) {
			t.Fatalf("the host lost %q, held by the spare, yet the spare is not stale", k)
		}
		after[k]++
		break
	}
}

// TestTrash: a removed pod's folder leaves the pods folder at once and is
// deleted from the trash in the background; Close waits for that, and a
// trash a dead daemon left (with a mount in it) is emptied on open.
func TestTrash(t *testing.T) {
	f := newFixture(t, "", nil)
	p, err := f.rt.Create(t.Context(), f.spec("trash1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Remove(t.Context(), p.UUID, true); err != nil {
		t.Fatal(err)
	}
	if dirs := f.podDirs(t); slices.Contains(dirs, p.UUID) {
		t.Fatalf("pod folder %s still in the pods folder after Remove: %v", p.UUID, dirs)
	}
	f.reopen(t) // Close waits for the background deletion
	trash := filepath.Join(f.opts.PodsDir, trashDir)
	if _, err := os.Lstat(trash); !os.IsNotExist(err) {
		t.Fatalf("trash left by Close: %v", err)
	}

	// Debris of a daemon killed mid-deletion, with a mount still in it.
	debris := filepath.Join(trash, p.UUID+".7", "stager")
	if err := os.MkdirAll(debris, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", debris, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(debris, unix.MNT_DETACH) })
	f.reopen(t)
	if _, err := os.Lstat(trash); !os.IsNotExist(err) {
		t.Fatalf("trash left after open: %v", err)
	}
	mis, err := readMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mis {
		if strings.HasPrefix(m.Point, trash) {
			t.Fatalf("mount left in the trash: %s", m.Point)
		}
	}
}
