package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/testutil"
)

// bins are the programs and the stager image the tests use.
type bins struct {
	kurmad, kurma string
	stager        string // file:// URI of the signed stager ACI
	stagerKey     string // its public key
}

// findBins locates kurmad, kurma and the stager image that `make build`
// made, building what is missing into t's temp dir.
// buildDir is where `make build` put binaries and images: $KURMA_BIN_DIR,
// else the repository's bin/.
func buildDir(t *testing.T) string {
	if d := os.Getenv("KURMA_BIN_DIR"); d != "" {
		return d
	}
	return filepath.Join(testutil.RepoRoot(t), "bin")
}

func findBins(t *testing.T) bins {
	t.Helper()
	b := bins{kurmad: testutil.Bin(t, "kurmad"), kurma: testutil.Bin(t, "kurma")}
	dir := buildDir(t)
	aci := filepath.Join(dir, "images", "kurma-stager.aci")
	key := filepath.Join(dir, "keys", "stager.pub")
	if fileExists(aci) && fileExists(aci+".sig") && fileExists(key) {
		b.stager, b.stagerKey = "file://"+aci, key
		return b
	}
	// No `make build` output: make a signed stager image here, laid out as
	// hack/build-images.sh does (/stager and the call-ins in /opt/stager).
	t.Logf("no stager image in %s; building one", dir)
	stager := testutil.Bin(t, "kurma-stager")
	acb := testutil.Bin(t, "kurma-acbuild")
	work := t.TempDir()
	root := filepath.Join(work, "root")
	must(t, os.MkdirAll(filepath.Join(root, "opt", "stager"), 0o755))
	data, err := os.ReadFile(stager)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "stager"), data, 0o755))
	for _, c := range []string{"status", "logs", "run", "attach"} {
		must(t, os.WriteFile(filepath.Join(root, "opt", "stager", c), data, 0o755))
	}
	aci = filepath.Join(work, "kurma-stager.aci")
	testutil.Run(t, acb, "keygen", "-o", filepath.Join(work, "stager"))
	testutil.Run(t, acb, "build", "-o", aci, "--name", "kurma.dev/kurma-stager", "--exec", "/stager",
		"--add", filepath.Join(root, "stager")+":/stager", "--add", filepath.Join(root, "opt")+":/opt")
	testutil.Run(t, acb, "sign", "--key", filepath.Join(work, "stager.key"), aci)
	b.stager, b.stagerKey = "file://"+aci, filepath.Join(work, "stager.pub")
	return b
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// daemon is a kurmad process on its own state directories and socket.
type daemon struct {
	t    *testing.T
	b    bins
	dir  string
	sock string
	cfg  string
	log  string
	cmd  *exec.Cmd
	// args are extra kurmad flags for the next start.
	args []string
}

// startDaemon writes a config under a fresh temp dir and starts kurmad. At
// cleanup it removes every pod, stops the daemon and fails the test when
// anything is left: mounts or processes under the dir, pod directories.
func startDaemon(t *testing.T, b bins, extraConfig ...string) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", testutil.UniqueName("kapi"))
	must(t, err)
	d := &daemon{t: t, b: b, dir: dir, sock: filepath.Join(dir, "kurma.sock"),
		cfg: filepath.Join(dir, "kurmad.yaml"), log: filepath.Join(dir, "kurmad.log")}
	cfg := fmt.Sprintf(`podsDir: %[1]s/pods
imagesDir: %[1]s/images
volumesDir: %[1]s/volumes
socket: %[2]s
stagerImage: %[3]s
trustedKeys: [%[4]s]
readyTimeout: 20s
`, dir, d.sock, b.stager, b.stagerKey) + strings.Join(extraConfig, "")
	must(t, os.WriteFile(d.cfg, []byte(cfg), 0o644))
	t.Cleanup(d.cleanup)
	d.start()
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	lf, err := os.OpenFile(d.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(d.t, err)
	defer lf.Close()
	cmd := exec.Command(d.b.kurmad, append([]string{"--config", d.cfg, "--log-level", "debug"}, d.args...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// The pods' netns references for the networking pod: one dir per
	// daemon, released by cleanup.
	cmd.Env = append(os.Environ(), "KURMA_NETNS_DIR="+d.netnsDir())
	must(d.t, cmd.Start())
	d.cmd = cmd
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, _, code := d.kurma("version"); code == 0 {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("kurmad did not come up; log:\n%s", d.logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemon) logText() string {
	b, _ := os.ReadFile(d.log)
	return string(b)
}

// kill9 kills kurmad hard, leaving its pods running.
func (d *daemon) kill9() {
	d.t.Helper()
	must(d.t, d.cmd.Process.Kill())
	_ = d.cmd.Wait()
	d.cmd = nil
}

// stop ends kurmad with SIGTERM and waits for it.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		d.cmd = nil
		return err
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
		d.cmd = nil
		return errors.New("kurmad did not stop within 20s of SIGTERM")
	}
}

func (d *daemon) cleanup() {
	t := d.t
	if d.cmd != nil {
		out, _, _ := d.kurma("ps", "-a", "-q")
		for _, u := range strings.Fields(out) {
			if d.isNetPod(u) {
				continue // kurmad removes it when it stops
			}
			if _, stderr, code := d.kurma("rm", "-f", u); code != 0 {
				t.Errorf("cleanup: rm -f %s: %s", u, stderr)
			}
		}
		if err := d.stop(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if ents, err := os.ReadDir(d.netnsDir()); err == nil {
		for _, e := range ents {
			t.Errorf("leaked after the test: netns reference %s", e.Name())
		}
	}
	if err := manager.ReleaseNetNSDir(d.netnsDir()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cleanup: %v", err)
	}
	leaks := findLeaks(d.dir)
	if ents, err := os.ReadDir(filepath.Join(d.dir, "pods")); err == nil {
		for _, e := range ents {
			leaks = append(leaks, "pod dir "+e.Name())
		}
	}
	if len(leaks) > 0 {
		t.Errorf("leaked after the test:\n  %s", strings.Join(leaks, "\n  "))
		forceClean(d.dir)
	}
	if t.Failed() {
		t.Logf("kurmad log:\n%s", tail(d.logText(), 80))
	}
	if err := os.RemoveAll(d.dir); err != nil {
		t.Errorf("remove %s: %v", d.dir, err)
	}
}

// netnsDir is this daemon's KURMA_NETNS_DIR.
func (d *daemon) netnsDir() string { return filepath.Join(d.dir, "netns") }

// isNetPod reports whether the pod with this UUID is kurmad's networking
// pod.
func (d *daemon) isNetPod(uuid string) bool {
	out, _, code := d.kurma("inspect", uuid)
	if code != 0 {
		return false
	}
	var ps []struct{ Name string }
	return json.Unmarshal([]byte(out), &ps) == nil && len(ps) == 1 && ps[0].Name == manager.DefaultNetPodName
}

// findLeaks lists mounts under dir and processes whose root or working
// directory is under dir.
func findLeaks(dir string) []string {
	var out []string
	for _, m := range mountsUnder(dir) {
		out = append(out, "mount "+m)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, l := range []string{"root", "cwd"} {
			if t, err := os.Readlink(fmt.Sprintf("/proc/%d/%s", pid, l)); err == nil && strings.HasPrefix(t, dir+"/") {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				out = append(out, fmt.Sprintf("process %d (%s) %s %s", pid, strings.TrimSpace(string(comm)), l, t))
				break
			}
		}
	}
	return out
}

func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// forceClean kills processes and lazily unmounts what a failed test left,
// so one failure does not poison the machine.
func forceClean(dir string) {
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if t, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err == nil && strings.HasPrefix(t, dir+"/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	ms := mountsUnder(dir)
	for i := len(ms) - 1; i >= 0; i-- {
		_ = syscall.Unmount(ms[i], syscall.MNT_DETACH)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kurma runs the CLI against this daemon and returns stdout, stderr and
// the exit code.
func (d *daemon) kurma(args ...string) (string, string, int) {
	return d.kurmaIn(nil, args...)
}

func (d *daemon) kurmaIn(stdin []byte, args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.b.kurma, append([]string{"--socket", d.sock}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

// ok runs the CLI and fails the test unless it exits 0.
func (d *daemon) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, code := d.kurma(args...)
	if code != 0 {
		t.Fatalf("kurma %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, stderr)
	}
	return out
}

// inspect returns a pod's record.
func (d *daemon) inspect(t *testing.T, ref string) *pod.Pod {
	t.Helper()
	var ps []*pod.Pod
	must(t, json.Unmarshal([]byte(d.ok(t, "inspect", ref)), &ps))
	if len(ps) != 1 {
		t.Fatalf("inspect %s: %d pods", ref, len(ps))
	}
	return ps[0]
}

// eventually retries f until it returns nil or the time is up.
func eventually(t *testing.T, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
