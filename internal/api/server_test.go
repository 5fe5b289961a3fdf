package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	apiclient "kurma.dev/kurma/internal/api/client"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// startServer serves a Server over fakes on a unix socket in a temp dir.
func startServer(t *testing.T) (*apiclient.Client, *fakeManager, *fakeStore, string) {
	t.Helper()
	fm := newFakeManager()
	fs := &fakeStore{imgs: map[string]*image.Image{
		"sha512-00": {ID: "sha512-00", Name: "busybox", Manifest: appc.ImageManifest{App: &appc.App{
			User: "1000", Group: "100", Environment: []appc.EnvVar{{Name: "PATH", Value: "/bin"}, {Name: "A", Value: "img"}}}}},
	}}
	c, sock, _ := serve(t, Options{Pods: fm, Images: fs, Version: "test"})
	return c, fm, fs, sock
}

// serve serves a Server made from opts on a unix socket in a temp dir.
// stop ends it and returns what Serve returned; cleanup calls it too, and
// checks that the socket is gone.
func serve(t *testing.T, opts Options) (c *apiclient.Client, sock string, stop func() error) {
	t.Helper()
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "k.sock")
	l, err := Listen(sock, -1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			serveErr = <-done
		})
		return serveErr
	}
	c = apiclient.New(sock)
	t.Cleanup(func() {
		c.Close()
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind", sock)
		}
	})
	return c, sock, stop
}

func TestSocketPermissions(t *testing.T) {
	_, _, _, sock := startServer(t)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode = %v, want socket 0660", fi.Mode())
	}
	if os.Geteuid() == 0 {
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
			t.Fatalf("socket owner uid %d, want 0", st.Uid)
		}
	}
	// A second daemon on the same socket is refused while the first lives.
	if _, err := Listen(sock, -1); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("second Listen: %v, want Conflict", err)
	}
}

func TestPodLifecycle(t *testing.T) {
	c, fm, _, _ := startServer(t)
	ctx := t.Context()
	v, err := c.Version(ctx)
	if err != nil || v.Version != "test" || v.APIVersion != "v1" {
		t.Fatalf("version = %+v, %v", v, err)
	}
	spec := pod.Spec{Name: "web", Apps: []pod.AppSpec{{Image: "busybox", Exec: []string{"sleep", "1"}}}}
	p, err := c.CreatePod(ctx, spec)
	if err != nil || p.Name != "web" || p.State != pod.Running {
		t.Fatalf("create = %+v, %v", p, err)
	}
	if _, err := c.CreatePod(ctx, spec); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("duplicate create: %v, want Conflict", err)
	}
	ps, err := c.ListPods(ctx)
	if err != nil || len(ps) != 1 {
		t.Fatalf("list = %v, %v", ps, err)
	}
	if err := c.RemovePod(ctx, "web", false); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("remove running: %v, want Conflict", err)
	}
	if err := c.StopPod(ctx, "web", 3); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetPod(ctx, p.UUID)
	if err != nil || got.State != pod.Exited || got.Error != "grace=3s" {
		t.Fatalf("after stop: %+v, %v", got, err)
	}
	if err := c.StopPod(ctx, "web", -1); err != nil {
		t.Fatal(err)
	}
	if got, _ := fm.Get(ctx, "web"); got.Error != "grace=10s" {
		t.Fatalf("default grace not applied: %q", got.Error)
	}
	st, err := c.PodStatus(ctx, "web")
	if err != nil || !st["app0"].Exited {
		t.Fatalf("status = %v, %v", st, err)
	}
	if err := c.RemovePod(ctx, "web", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetPod(ctx, "web"); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("get removed: %v, want NotFound", err)
	}
	// Generated names when none is given.
	p2, err := c.CreatePod(ctx, pod.Spec{Apps: []pod.AppSpec{{Image: "docker://reg:5000/lib/Busy.box:1.2"}}})
	if err != nil || !strings.HasPrefix(p2.Name, "Busy.box-") || !ValidPodName(p2.Name) {
		t.Fatalf("generated name %q, %v", p2.Name, err)
	}
}

func TestErrors(t *testing.T) {
	c, _, _, sock := startServer(t)
	ctx := t.Context()
	tests := []struct {
		name string
		call func() error
		cat  error
	}{
		{"get missing", func() error { _, err := c.GetPod(ctx, "nope"); return err }, kerrors.NotFound},
		{"stop missing", func() error { return c.StopPod(ctx, "nope", 1) }, kerrors.NotFound},
		{"no apps", func() error { _, err := c.CreatePod(ctx, pod.Spec{Name: "x"}); return err }, kerrors.Invalid},
		{"bad name", func() error {
			_, err := c.CreatePod(ctx, pod.Spec{Name: "../etc", Apps: []pod.AppSpec{{Image: "x"}}})
			return err
		}, kerrors.Invalid},
		{"exec missing pod", func() error {
			_, err := c.Exec(ctx, "nope", ExecRequest{Exec: []string{"true"}}, apiclient.StreamIO{})
			return err
		}, kerrors.NotFound},
		{"exec no command", func() error { _, err := c.Exec(ctx, "nope", ExecRequest{}, apiclient.StreamIO{}); return err }, kerrors.Invalid},
		{"image missing", func() error { _, err := c.GetImage(ctx, "docker://x/y:z"); return err }, kerrors.NotFound},
		{"pull unreachable", func() error { _, err := c.Pull(ctx, "docker://nowhere/x", false, nil); return err }, kerrors.Unavailable},
		{"daemon down", func() error {
			_, err := apiclient.New(sock + ".none").Version(ctx)
			return err
		}, kerrors.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.cat) {
				t.Fatalf("err = %v, want %v", err, tc.cat)
			}
		})
	}
}

func TestExec(t *testing.T) {
	c, fm, _, _ := startServer(t)
	ctx := t.Context()
	if _, err := c.CreatePod(ctx, pod.Spec{Name: "p", Apps: []pod.AppSpec{{Name: "main", Image: "busybox", Env: []appc.EnvVar{{Name: "A", Value: "spec"}}}}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name           string
		req            ExecRequest
		stdin          io.Reader
		resize         bool
		code           int
		stdout, stderr string
	}{
		{"echo", ExecRequest{Exec: []string{"echo", "hi"}}, nil, false, 0, "[hi]\n", ""},
		{"exit code", ExecRequest{Exec: []string{"exit", "42"}}, nil, false, 42, "", ""},
		{"stderr", ExecRequest{App: "main", Exec: []string{"fail"}}, nil, false, 1, "", "oops"},
		{"stdin", ExecRequest{Exec: []string{"cat"}}, strings.NewReader(strings.Repeat("x", 3<<20)), false, 0, strings.Repeat("x", 3<<20), ""},
		{"resize", ExecRequest{Exec: []string{"size"}, TTY: true, Rows: 24, Cols: 80}, nil, true, 0, "24x80", ""},
		{"env and user", ExecRequest{Exec: []string{"env"}, Env: []appc.EnvVar{{Name: "B", Value: "req"}}}, nil, false, 0,
			"PATH=/bin\nA=spec\nB=req\nuser=1000 group=100\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code, err := c.Exec(ctx, "p", tc.req, apiclient.StreamIO{Stdin: tc.stdin, Stdout: &out, Stderr: &errb})
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || out.String() != tc.stdout || errb.String() != tc.stderr {
				t.Fatalf("code %d stdout %.40q stderr %q; want %d %.40q %q", code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	t.Run("stdin left open", func(t *testing.T) {
		// The client never closes stdin; the process exits anyway and the
		// call must end with it.
		pr, pw := io.Pipe()
		t.Cleanup(func() { pw.Close() })
		done := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, "p", ExecRequest{Exec: []string{"true-proc"}}, apiclient.StreamIO{Stdin: pr, Stdout: io.Discard})
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("exec hung on the client's open stdin")
		}
	})
	t.Run("manager error", func(t *testing.T) {
		_, err := c.Exec(ctx, "p", ExecRequest{Exec: []string{"boom"}}, apiclient.StreamIO{})
		if !errors.Is(err, kerrors.Unavailable) || !strings.Contains(err.Error(), "stager gone") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unknown app", func(t *testing.T) {
		_, err := c.Exec(ctx, "p", ExecRequest{App: "other", Exec: []string{"true"}}, apiclient.StreamIO{})
		if !errors.Is(err, kerrors.NotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	if len(fm.execs) == 0 || fm.execs[0].User != "1000" {
		t.Fatalf("run settings not filled from image: %+v", fm.execs)
	}
}

func TestRunAndAttach(t *testing.T) {
	c, fm, _, _ := startServer(t)
	ctx := t.Context()
	fm.logs = "hello from app\n"
	fm.exit = 7
	var out bytes.Buffer
	var seen *pod.Pod
	p, code, err := c.RunPod(ctx, CreatePodRequest{Spec: pod.Spec{Apps: []pod.AppSpec{{Image: "busybox"}}}, Remove: true},
		apiclient.StreamIO{Stdout: &out, OnPod: func(p *pod.Pod) { seen = p }})
	if err != nil {
		t.Fatal(err)
	}
	if code != 7 || out.String() != fm.logs || p == nil || seen == nil || p.UUID != seen.UUID {
		t.Fatalf("run: code %d out %q pod %v", code, out.String(), p)
	}
	if _, err := fm.Get(ctx, p.UUID); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("--rm pod still there: %v", err)
	}
	// An app still running when the pod is ready: its log is followed and
	// the status polled until it exits.
	fm.running = 3
	out.Reset()
	_, code, err = c.RunPod(ctx, CreatePodRequest{Spec: pod.Spec{Apps: []pod.AppSpec{{Image: "busybox"}}}, Remove: true}, apiclient.StreamIO{Stdout: &out})
	if err != nil || code != 7 || out.String() != fm.logs || fm.running != 0 {
		t.Fatalf("followed run: code %d out %q running %d err %v", code, out.String(), fm.running, err)
	}
	// Without remove the pod stays; attach echoes stdin.
	p, _, err = c.RunPod(ctx, CreatePodRequest{Spec: pod.Spec{Name: "keep", Apps: []pod.AppSpec{{Image: "busybox"}}}}, apiclient.StreamIO{Stdout: io.Discard})
	if err != nil || p.Name != "keep" {
		t.Fatalf("run keep: %v %v", p, err)
	}
	out.Reset()
	code, err = c.Attach(ctx, "keep", AttachRequest{}, apiclient.StreamIO{Stdin: strings.NewReader("ping\n"), Stdout: &out})
	if err != nil || out.String() != "ping\n" || code != 7 {
		t.Fatalf("attach: %q %d %v", out.String(), code, err)
	}
	// A failed create is an ordinary error, not a stream.
	_, _, err = c.RunPod(ctx, CreatePodRequest{Spec: pod.Spec{Name: "keep", Apps: []pod.AppSpec{{Image: "busybox"}}}}, apiclient.StreamIO{})
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("run duplicate: %v", err)
	}
}

func TestLogs(t *testing.T) {
	c, fm, _, _ := startServer(t)
	ctx := t.Context()
	if _, err := c.CreatePod(ctx, pod.Spec{Name: "two", Apps: []pod.AppSpec{{Name: "a", Image: "x"}, {Name: "b", Image: "y"}}}); err != nil {
		t.Fatal(err)
	}
	fm.logs = "line1\nline2\n"
	var out bytes.Buffer
	if err := c.Logs(ctx, "two", "b", true, &out); err != nil || out.String() != fm.logs {
		t.Fatalf("logs: %q %v", out.String(), err)
	}
	if err := c.Logs(ctx, "two", "", false, io.Discard); !errors.Is(err, kerrors.Invalid) {
		t.Fatalf("logs without app on a two-app pod: %v", err)
	}
	fm.logsErr = kerrors.New(kerrors.Unavailable, "stager died")
	out.Reset()
	err := c.Logs(ctx, "two", "a", false, &out)
	if !errors.Is(err, kerrors.Unavailable) || out.String() != fm.logs {
		t.Fatalf("logs error trailer: %q %v", out.String(), err)
	}
}

func TestImages(t *testing.T) {
	c, _, _, _ := startServer(t)
	ctx := t.Context()
	var prog []image.Progress
	img, err := c.Pull(ctx, "docker://127.0.0.1:5000/busybox:latest", true, func(p image.Progress) { prog = append(prog, p) })
	if err != nil || img.ID != "sha512-abcd" || len(prog) != 3 || prog[2].Current != 3 {
		t.Fatalf("pull: %v %v %v", img, prog, err)
	}
	got, err := c.GetImage(ctx, "docker://127.0.0.1:5000/busybox:latest")
	if err != nil || got.ID != img.ID {
		t.Fatalf("get by ref with slashes: %v %v", got, err)
	}
	imgs, err := c.ListImages(ctx)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("list: %v %v", imgs, err)
	}
	if err := c.RemoveImage(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveImage(ctx, img.ID); !errors.Is(err, kerrors.NotFound) {
		t.Fatalf("second remove: %v", err)
	}
}

func TestShutdownCancelsStreams(t *testing.T) {
	fm := newFakeManager()
	c, _, stop := serve(t, Options{Pods: &blockingLogs{fm}, Images: &fakeStore{imgs: map[string]*image.Image{}}})
	if _, err := c.CreatePod(t.Context(), pod.Spec{Name: "f", Apps: []pod.AppSpec{{Image: "x"}}}); err != nil {
		t.Fatal(err)
	}
	logDone := make(chan error, 1)
	go func() { logDone <- c.Logs(t.Context(), "f", "", true, io.Discard) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	<-logDone
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("shutdown took %v with a follower", d)
	}
}

// blockingLogs follows logs until its context ends.
type blockingLogs struct{ *fakeManager }

func (b *blockingLogs) Logs(ctx context.Context, ref, app string, follow bool, w io.Writer) error {
	_, _ = io.WriteString(w, "x")
	<-ctx.Done()
	return ctx.Err()
}
