package api

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// fakeManager is an in-memory pod.Manager for the HTTP layer's tests. Its
// Exec understands a tiny language: "echo ARGS" writes ARGS, "cat" copies
// stdin, "fail" writes to stderr, "exit N" returns N, "size" prints the
// first resize it receives.
type fakeManager struct {
	mu      sync.Mutex // guards pods, execs
	pods    map[string]*pod.Pod
	execs   []stagerspec.RunSettings
	logs    string
	logsErr error
	exit    int
	// running is how many more status calls report the apps running.
	running int
}

var _ pod.Manager = (*fakeManager)(nil)

func newFakeManager() *fakeManager { return &fakeManager{pods: map[string]*pod.Pod{}} }

func (f *fakeManager) Create(ctx context.Context, spec pod.Spec) (*pod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pods {
		if p.Name == spec.Name {
			return nil, kerrors.New(kerrors.Conflict, "pod %q exists", spec.Name)
		}
	}
	p := &pod.Pod{UUID: fmt.Sprintf("uuid-%d", len(f.pods)+1), Name: spec.Name, State: pod.Running, Spec: spec, Created: time.Now()}
	for i, a := range spec.Apps {
		n := a.Name
		if n == "" {
			n = "app" + strconv.Itoa(i)
		}
		p.Apps = append(p.Apps, pod.AppInfo{Name: n, Image: a.Image, ImageID: "sha512-00"})
	}
	f.pods[p.UUID] = p
	cp := *p
	return &cp, nil
}

func (f *fakeManager) find(ref string) (*pod.Pod, error) {
	for _, p := range f.pods {
		if p.UUID == ref || p.Name == ref {
			return p, nil
		}
	}
	return nil, kerrors.New(kerrors.NotFound, "no pod %q", ref)
}

func (f *fakeManager) Get(ctx context.Context, ref string) (*pod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.find(ref)
	if err != nil {
		return nil, err
	}
	cp := *p
	return &cp, nil
}

func (f *fakeManager) List(ctx context.Context) ([]*pod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*pod.Pod
	for _, p := range f.pods {
		cp := *p
		out = append(out, &cp)
	}
	return out, nil
}

func (f *fakeManager) Stop(ctx context.Context, ref string, grace time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.find(ref)
	if err != nil {
		return err
	}
	p.State = pod.Exited
	p.Error = "grace=" + grace.String()
	return nil
}

func (f *fakeManager) Remove(ctx context.Context, ref string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.find(ref)
	if err != nil {
		return err
	}
	if p.State == pod.Running && !force {
		return kerrors.New(kerrors.Conflict, "pod %s is running", p.Name)
	}
	delete(f.pods, p.UUID)
	return nil
}

func (f *fakeManager) Status(ctx context.Context, ref string) (stagerspec.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.find(ref)
	if err != nil {
		return nil, err
	}
	st := stagerspec.Status{}
	for _, a := range p.Apps {
		code := f.exit
		st[a.Name] = stagerspec.AppStatus{Exited: true, ExitCode: &code}
		if f.running > 0 {
			st[a.Name] = stagerspec.AppStatus{PID: 7}
		}
	}
	if f.running > 0 {
		f.running--
	}
	return st, nil
}

func (f *fakeManager) Exec(ctx context.Context, ref, app string, s stagerspec.RunSettings, stdio pod.IO) (int, error) {
	if _, err := f.Get(ctx, ref); err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.execs = append(f.execs, s)
	f.mu.Unlock()
	switch s.Exec[0] {
	case "echo":
		fmt.Fprintln(stdio.Stdout, s.Exec[1:])
	case "cat":
		if stdio.Stdin == nil {
			return 0, kerrors.New(kerrors.Invalid, "no stdin")
		}
		if _, err := io.Copy(stdio.Stdout, stdio.Stdin); err != nil {
			return 0, err
		}
	case "fail":
		fmt.Fprint(stdio.Stderr, "oops")
		return 1, nil
	case "exit":
		n, _ := strconv.Atoi(s.Exec[1])
		return n, nil
	case "size":
		select {
		case ts := <-stdio.Resize:
			fmt.Fprintf(stdio.Stdout, "%dx%d", ts.Rows, ts.Cols)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	case "env":
		for _, e := range s.Environment {
			fmt.Fprintf(stdio.Stdout, "%s=%s\n", e.Name, e.Value)
		}
		fmt.Fprintf(stdio.Stdout, "user=%s group=%s\n", s.User, s.Group)
	case "true-proc":
		// A real process that ignores its stdin, run the way the pod
		// manager runs call-ins.
		cmd := exec.CommandContext(ctx, "true")
		cmd.Stdin, cmd.Stdout = stdio.Stdin, stdio.Stdout
		if err := cmd.Run(); err != nil {
			return -1, err
		}
	case "boom":
		return 0, kerrors.New(kerrors.Unavailable, "stager gone")
	}
	return 0, nil
}

func (f *fakeManager) Logs(ctx context.Context, ref, app string, follow bool, w io.Writer) error {
	if _, err := f.Get(ctx, ref); err != nil {
		return err
	}
	if _, err := io.WriteString(w, f.logs); err != nil {
		return err
	}
	return f.logsErr
}

func (f *fakeManager) Attach(ctx context.Context, ref, app string, stdio pod.IO) error {
	if _, err := f.Get(ctx, ref); err != nil {
		return err
	}
	if stdio.Stdin == nil {
		return nil
	}
	_, err := io.Copy(stdio.Stdout, stdio.Stdin)
	return err
}

// fakeStore is an in-memory image.Store.
type fakeStore struct {
	mu   sync.Mutex // guards imgs
	imgs map[string]*image.Image
}

var _ image.Store = (*fakeStore)(nil)

func (s *fakeStore) Pull(ctx context.Context, uri string, o image.PullOptions) (*image.Image, error) {
	if uri == "docker://nowhere/x" {
		return nil, kerrors.New(kerrors.Unavailable, "registry unreachable")
	}
	for i := int64(1); i <= 3; i++ {
		if o.Progress != nil {
			o.Progress(image.Progress{Ref: "layer", Status: "fetching", Current: i, Total: 3})
		}
	}
	img := &image.Image{ID: "sha512-abcd", Name: uri, Refs: []string{uri}}
	s.mu.Lock()
	s.imgs[img.ID] = img
	s.mu.Unlock()
	return img, nil
}

func (s *fakeStore) Get(ctx context.Context, ref string) (*image.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, img := range s.imgs {
		if img.ID == ref || img.Name == ref {
			return img, nil
		}
	}
	return nil, kerrors.New(kerrors.NotFound, "no image %q", ref)
}

func (s *fakeStore) List(ctx context.Context) ([]*image.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*image.Image
	for _, img := range s.imgs {
		out = append(out, img)
	}
	return out, nil
}

func (s *fakeStore) Remove(ctx context.Context, ref string) error {
	img, err := s.Get(ctx, ref)
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.imgs, img.ID)
	s.mu.Unlock()
	return nil
}

func (s *fakeStore) Resolve(ctx context.Context, id string) ([]image.Layer, error) { return nil, nil }
func (s *fakeStore) Lease(ctx context.Context, h string, ids ...string) error      { return nil }
func (s *fakeStore) Unlease(ctx context.Context, h string) error                   { return nil }
