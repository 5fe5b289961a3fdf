package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// fakePods is a pod.Manager fake for the supervisor's logic: the networking
// pod's apps exit when the test says so.
type fakePods struct {
	pod.Manager
	mu      sync.Mutex
	creates int
	exists  bool
	spec    pod.Spec
	status  stagerspec.Status
}

func (f *fakePods) Create(ctx context.Context, spec pod.Spec) (*pod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates++
	f.exists, f.spec = true, spec
	f.status = stagerspec.Status{}
	for _, a := range spec.Apps {
		f.status[a.Name] = stagerspec.AppStatus{PID: 1}
	}
	return &pod.Pod{Name: spec.Name}, nil
}

func (f *fakePods) Get(ctx context.Context, ref string) (*pod.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.exists {
		return nil, kerrors.New(kerrors.NotFound, "no pod %s", ref)
	}
	return &pod.Pod{Name: f.spec.Name, State: pod.Running, Spec: f.spec}, nil
}

func (f *fakePods) Status(ctx context.Context, ref string) (stagerspec.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.exists {
		return nil, kerrors.New(kerrors.NotFound, "no pod %s", ref)
	}
	out := stagerspec.Status{}
	for k, v := range f.status {
		out[k] = v
	}
	return out, nil
}

func (f *fakePods) Remove(ctx context.Context, ref string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.exists {
		return kerrors.New(kerrors.NotFound, "no pod %s", ref)
	}
	f.exists = false
	return nil
}

func (f *fakePods) exit(app string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status[app] = stagerspec.AppStatus{Exited: true, ExitCode: &code}
}

func (f *fakePods) count() (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creates, f.exists
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSupervisorRestartsFailedPlugin(t *testing.T) {
	nets := []netconf.Network{
		{Name: "knma", ACI: "file:///a.aci", Default: true, Config: json.RawMessage(`{}`)},
		{Name: "knmb", ACI: "file:///b.aci", Config: json.RawMessage(`{}`)},
	}
	m, err := manager.New(manager.Options{Networks: nets, Caller: &manager.HostCaller{}, InitialState: manager.Starting})
	if err != nil {
		t.Fatal(err)
	}
	fp := &fakePods{}
	s, err := manager.NewSupervisor(manager.SupervisorOptions{Pods: fp, Manager: m,
		PollInterval: 5 * time.Millisecond, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	state := func(i int) manager.NetworkInfo { return m.List(ctx)[i] }

	waitFor(t, "running", func() bool { return state(0).State == manager.Running && state(1).State == manager.Running })
	fp.mu.Lock()
	spec := fp.spec
	fp.mu.Unlock()
	if spec.Networks[0] != "host" || len(spec.Apps) != 2 || spec.Apps[1].Image != "file:///b.aci" {
		t.Fatalf("networking pod spec %+v", spec)
	}
	fp.exit("knmb", 3)
	waitFor(t, "failed", func() bool { return state(1).State == manager.Failed })
	if e := state(1).Error; e != "plugin main executable exited with status 3" {
		t.Errorf("error %q", e)
	}
	// Attaches to the failed network are refused while it is down.
	_, aerr := m.Attach(ctx, &pod.Pod{UUID: "u", NetNS: "/proc/self/ns/net", Spec: pod.Spec{Networks: []string{"knmb"}}})
	waitFor(t, "restart", func() bool { n, _ := fp.count(); return n == 2 && state(1).State == manager.Running })
	if state(1).Restarts != 1 {
		t.Errorf("restarts %d", state(1).Restarts)
	}
	if aerr != nil && !kerrorsIsUnavailable(aerr) {
		t.Errorf("attach during failure: %v", aerr)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Run leaves the pod for the next kurmad, which adopts it.
	if _, exists := fp.count(); !exists {
		t.Fatal("networking pod removed when the supervisor ended")
	}
	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	go func() { done <- s.Run(ctx2) }()
	waitFor(t, "adopted", func() bool { return state(0).State == manager.Running && state(1).State == manager.Running })
	if n, _ := fp.count(); n != 2 {
		t.Errorf("creates after adoption: %d, want 2", n)
	}
	cancel2()
	<-done
	s.Stop(t.Context())
	if _, exists := fp.count(); exists {
		t.Error("networking pod left after Stop")
	}
}

func TestNetPodSpec(t *testing.T) {
	nets := []netconf.Network{
		{Name: "knp_A", ACI: "file:///a.aci", Config: json.RawMessage(`{"a":1}`)},
		{Name: "knpb", ACI: "file:///b.aci", Config: json.RawMessage(`{"b":2}`)},
	}
	m, err := manager.New(manager.Options{Networks: nets, Caller: &manager.HostCaller{}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := manager.NewSupervisor(manager.SupervisorOptions{Pods: &fakePods{}, Manager: m,
		NetNSDir: "/run/knp/netns", StateDir: "/var/lib/knp/network"})
	if err != nil {
		t.Fatal(err)
	}
	spec := s.Spec()
	if !spec.HostIPC || !spec.HostUTS || !spec.VolumePropagation || spec.Networks[0] != "host" {
		t.Errorf("host namespaces/propagation: %+v", spec)
	}
	if spec.Reserved() == "" {
		t.Error("the networking pod's spec should use reserved options")
	}
	if spec.Apps[0].Name != "net-0" || spec.Apps[1].Name != "knpb" {
		t.Errorf("app names %q %q", spec.Apps[0].Name, spec.Apps[1].Name)
	}
	a := spec.Apps[0]
	if string(a.Stdin) != `{"a":1}` || !a.HostPrivileged {
		t.Errorf("app 0: stdin %q privileged %v", a.Stdin, a.HostPrivileged)
	}
	want := map[string]string{"/run/knp/netns": "/run/knp/netns", netconf.PluginStateDir: "/var/lib/knp/network/knp_A"}
	vols := map[string]string{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v.Source
	}
	for _, mt := range a.Mounts {
		if want[mt.Path] != vols[mt.Volume] {
			t.Errorf("mount %s: volume source %q, want %q", mt.Path, vols[mt.Volume], want[mt.Path])
		}
		delete(want, mt.Path)
	}
	if len(want) != 0 {
		t.Errorf("missing mounts %v", want)
	}
}

func kerrorsIsUnavailable(err error) bool { return errors.Is(err, kerrors.Unavailable) }
