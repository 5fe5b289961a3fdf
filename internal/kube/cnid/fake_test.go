package cnid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cnitypes "github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// fakeAgent answers Attach with a set port or error and records calls.
type fakeAgent struct {
	mu       sync.Mutex
	port     controllerapi.Port
	err      error
	calls    []string // "attach <port> <device>", "detach <port>"
	synced   chan struct{}
	restored []string
	// With wait set, Attach returns only once wait is closed (or its
	// context ends); plugging is what Plugging answers, and asked is
	// closed at its first call.
	wait     chan struct{}
	plugging bool
	asked    chan struct{}
}

func (a *fakeAgent) Attach(ctx context.Context, portID string, at agent.Attachment) (controllerapi.Port, error) {
	if a.wait != nil {
		select {
		case <-ctx.Done():
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, ctx.Err())
		case <-a.wait:
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, "attach "+portID+" "+at.DeviceID+" "+at.DeviceOwner)
	return a.port, a.err
}

func (a *fakeAgent) Detach(_ context.Context, portID string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, "detach "+portID)
	return nil
}

func (a *fakeAgent) Restore(portID string, _ agent.Attachment) {
	a.restored = append(a.restored, portID)
}
func (a *fakeAgent) Synced() <-chan struct{} { return a.synced }

func (a *fakeAgent) Plugging(string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.asked != nil {
		select {
		case <-a.asked:
		default:
			close(a.asked)
		}
	}
	return a.plugging
}

func (a *fakeAgent) takeCalls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

type policyFunc func(ctx context.Context, ns, name string) error

func (f policyFunc) WaitPod(ctx context.Context, ns, name string, _ netip.Addr) error {
	return f(ctx, ns, name)
}

const testHost = "n1"

// thePort is the controller's port of pod u1.
var thePort = controllerapi.Port{ID: "pod-u1", ProjectID: "k8s", MACAddress: "02:00:00:00:00:05",
	DeviceID: "u1", DeviceOwner: podnet.PortOwner, BindingHostID: testHost,
	FixedIPs: []controllerapi.FixedIP{{SubnetID: "ns-x", IPAddress: "10.32.0.5"}}}

// annotation is pod u1's annotation, changed by edit.
func annotation(t *testing.T, edit func(*podnet.Network)) string {
	t.Helper()
	n := podnet.Network{PortID: "pod-u1", ProjectID: "k8s", SubnetID: "ns-x", MAC: thePort.MACAddress,
		IPs: []string{"10.32.0.5/16"}, Gateways: []string{"10.32.0.1"}, PodUID: "u1", HostID: testHost}
	if edit != nil {
		edit(&n)
	}
	v, err := podnet.Encode(podnet.Networks{podnet.DefaultNetwork: n})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func fakePod(uid, ann string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: testHost}}
	if ann != "" {
		p.Annotations = map[string]string{podnet.Annotation: ann}
	}
	return p
}

type fakeEnv struct {
	d     *Daemon
	kube  *fake.Clientset
	ag    *fakeAgent
	netns string
}

// newFakeDaemon is a daemon on a fake clientset holding objs and a fake
// agent, its pod watch synced; requests go to Handle (no socket).
func newFakeDaemon(t *testing.T, annotationTimeout time.Duration, objs ...*corev1.Pod) *fakeEnv {
	t.Helper()
	kube := fake.NewClientset()
	for _, p := range objs {
		if _, err := kube.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ag := &fakeAgent{port: thePort, synced: make(chan struct{})}
	close(ag.synced)
	d, err := New(Config{Kube: kube, NodeName: testHost, Agent: ag, StateDir: t.TempDir(),
		AnnotationTimeout: annotationTimeout, PollInterval: time.Hour, AttachTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); d.fac.Shutdown() })
	d.fac.Start(ctx.Done())
	for _, ok := range d.fac.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatal("pod watch not synced")
		}
	}
	netns := filepath.Join(t.TempDir(), "netns") // ADD only checks that it exists
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return &fakeEnv{d: d, kube: kube, ag: ag, netns: netns}
}

const conf = `{"cniVersion":"1.0.0","name":"kurma","type":"kurma-k8s"}`

// do runs one CNI verb for pod ns/p (runtime UID uid) and returns the
// error code (0: success) and stdout.
func (e *fakeEnv) do(t *testing.T, cmd, cid, uid, stdin string) (uint, []byte) {
	t.Helper()
	args := "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=" + cid
	if uid != "" {
		args += ";K8S_POD_UID=" + uid
	}
	resp := e.d.Handle(context.Background(), &cniwire.Request{Env: map[string]string{
		"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_NETNS": e.netns, "CNI_IFNAME": "eth0", "CNI_ARGS": args,
	}, Stdin: []byte(stdin)})
	if resp.ExitCode == 0 {
		return 0, resp.Stdout
	}
	var ce cnitypes.Error
	if err := json.Unmarshal(resp.Stdout, &ce); err != nil {
		t.Fatalf("error JSON %q: %v", resp.Stdout, err)
	}
	return ce.Code, resp.Stdout
}

// TestAdd: what ADD answers and asks of the agent for each kind of pod,
// annotation and agent answer. A forged annotation never reaches the
// agent.
func TestAdd(t *testing.T) {
	other := thePort
	other.FixedIPs = []controllerapi.FixedIP{{IPAddress: "10.32.0.77"}}
	attach := "attach pod-u1 u1 " + podnet.PortOwner
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod // nil: none
		uid    string      // the runtime's K8S_POD_UID
		conf   string
		agent  func(*fakeAgent)
		policy error
		code   uint
		calls  []string
		kept   bool // the attachment is recorded
	}{
		{name: "plugged", pod: fakePod("u1", annotation(t, nil)), uid: "u1", calls: []string{attach}, kept: true},
		{name: "no runtime uid", pod: fakePod("u1", annotation(t, nil)), calls: []string{attach}, kept: true},
		{name: "no pod", uid: "u1", code: cniwire.ErrPodNotFound},
		{name: "pod replaced", pod: fakePod("u2", annotation(t, nil)), uid: "u1", code: cniwire.ErrUIDMismatch},
		{name: "no annotation", pod: fakePod("u1", ""), uid: "u1", code: cniwire.ErrAnnotationTimeout},
		{name: "annotation of another uid", pod: fakePod("u1", annotation(t, func(n *podnet.Network) { n.PodUID = "u9" })),
			uid: "u1", code: cniwire.ErrUIDMismatch},
		{name: "forged: another pod's port", pod: fakePod("u1", annotation(t, func(n *podnet.Network) { n.PortID = "pod-victim" })),
			uid: "u1", code: cniwire.ErrPortNotOwned},
		{name: "bound to another host", pod: fakePod("u1", annotation(t, func(n *podnet.Network) { n.HostID = "n2" })),
			uid: "u1", code: cniwire.ErrAnnotationTimeout},
		{name: "agent: not the pod's port", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			agent: func(a *fakeAgent) { a.err = fmt.Errorf("%w: held", agent.ErrNotOwned) },
			code:  cniwire.ErrPortNotOwned, calls: []string{attach}}, // no detach: it is another's
		{name: "annotation's addresses not the port's", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			agent: func(a *fakeAgent) { a.port = other },
			code:  cniwire.ErrPortNotOwned, calls: []string{attach, "detach pod-u1"}},
		{name: "controller unreachable", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			agent: func(a *fakeAgent) { a.err = kerrors.New(kerrors.Unavailable, "down") },
			code:  cniwire.ErrControllerUnreachable, calls: []string{attach, "detach pod-u1"}},
		{name: "plug failed", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			agent: func(a *fakeAgent) { a.err = errors.New("netlink") },
			code:  cniwire.ErrPlugFailed, calls: []string{attach, "detach pod-u1"}},
		{name: "policy not ready", pod: fakePod("u1", annotation(t, nil)), uid: "u1", policy: errors.New("late"),
			code: cniwire.ErrPolicyNotReady, calls: []string{"detach pod-u1"}},
		{name: "chained after another plugin", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			conf: `{"cniVersion":"1.0.0","name":"kurma","type":"kurma-k8s","prevResult":{"cniVersion":"1.0.0"}}`,
			code: cnitypes.ErrInvalidNetworkConfig},
		{name: "unknown version", pod: fakePod("u1", annotation(t, nil)), uid: "u1",
			conf: `{"cniVersion":"9.9.9","name":"kurma","type":"kurma-k8s"}`, code: cnitypes.ErrIncompatibleCNIVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*corev1.Pod
			if tc.pod != nil {
				pods = append(pods, tc.pod)
			}
			e := newFakeDaemon(t, 200*time.Millisecond, pods...)
			if tc.agent != nil {
				tc.agent(e.ag)
			}
			if tc.policy != nil {
				e.d.cfg.Policy = policyFunc(func(context.Context, string, string) error { return tc.policy })
			}
			c := tc.conf
			if c == "" {
				c = conf
			}
			code, out := e.do(t, "ADD", "c1", tc.uid, c)
			if code != tc.code {
				t.Fatalf("code %d, want %d: %s", code, tc.code, out)
			}
			if calls := e.ag.takeCalls(); !slices.Equal(calls, tc.calls) {
				t.Fatalf("agent calls %q, want %q", calls, tc.calls)
			}
			_, kept := e.d.records["c1_eth0"]
			_, statErr := os.Stat(filepath.Join(e.d.cfg.StateDir, "c1_eth0.json"))
			if kept != tc.kept || (statErr == nil) != tc.kept {
				t.Fatalf("record kept %t (file: %v), want %t", kept, statErr, tc.kept)
			}
			if code != 0 {
				return
			}
			var res types100.Result
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatal(err)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.32.0.5/16" || res.IPs[0].Gateway.String() != "10.32.0.1" ||
				len(res.Interfaces) != 1 || res.Interfaces[0].Mac != thePort.MACAddress || res.Interfaces[0].Sandbox != e.netns {
				t.Fatalf("result %s", out)
			}
		})
	}
}

// TestAddWaitsForAnnotation: an ADD that comes before the watcher wrote
// the annotation is woken by the pod watch (polling is an hour away here).
func TestAddWaitsForAnnotation(t *testing.T) {
	e := newFakeDaemon(t, 20*time.Second, fakePod("u1", ""))
	done := make(chan uint, 1)
	go func() {
		code, _ := e.do(t, "ADD", "c1", "u1", conf)
		done <- code
	}()
	// Wait until the ADD waits on the pod's next event.
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.d.mu.Lock()
		n := len(e.d.waiters["ns/p"])
		e.d.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ADD not waiting within 20s")
		}
		time.Sleep(time.Millisecond)
	}
	p := fakePod("u1", annotation(t, nil))
	if _, err := e.kube.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("ADD: code %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ADD not woken by the annotation within 10s")
	}
}

// TestDelGCStatus: DEL unplugs and forgets, twice is success; GC unplugs
// what the runtime no longer lists; STATUS follows the agent.
func TestDelGCStatus(t *testing.T) {
	e := newFakeDaemon(t, 200*time.Millisecond, fakePod("u1", annotation(t, nil)))
	if code, out := e.do(t, "ADD", "c1", "u1", conf); code != 0 {
		t.Fatalf("ADD: %s", out)
	}
	e.ag.takeCalls()
	for i, want := range [][]string{{"detach pod-u1"}, nil} {
		if code, out := e.do(t, "DEL", "c1", "u1", conf); code != 0 {
			t.Fatalf("DEL %d: %s", i, out)
		}
		if calls := e.ag.takeCalls(); !slices.Equal(calls, want) {
			t.Fatalf("DEL %d: agent calls %q, want %q", i, calls, want)
		}
	}
	for _, cid := range []string{"c2", "c3"} {
		if code, out := e.do(t, "ADD", cid, "u1", conf); code != 0 {
			t.Fatalf("ADD %s: %s", cid, out)
		}
	}
	e.ag.takeCalls()
	gc := `{"cniVersion":"1.1.0","name":"kurma","type":"kurma-k8s","cni.dev/valid-attachments":[{"containerID":"c3","ifname":"eth0"}]}`
	if code, out := e.do(t, "GC", "c3", "", gc); code != 0 {
		t.Fatalf("GC: %s", out)
	}
	// c2's attachment goes (one unplug), c3's stays.
	if calls := e.ag.takeCalls(); !slices.Equal(calls, []string{"detach pod-u1"}) {
		t.Fatalf("GC: agent calls %q", calls)
	}
	if _, ok := e.d.records["c2_eth0"]; ok {
		t.Fatal("GC kept c2's record")
	}
	if _, ok := e.d.records["c3_eth0"]; !ok {
		t.Fatal("GC dropped c3's record")
	}
	if code, out := e.do(t, "STATUS", "c3", "", conf); code != 0 {
		t.Fatalf("STATUS: %s", out)
	}
	e.ag.synced = make(chan struct{})
	if code, _ := e.do(t, "STATUS", "c3", "", conf); code != cnitypes.ErrPluginNotAvailable {
		t.Fatalf("STATUS with the agent not synced: code %d", code)
	}
}

// TestAddPlugGrace: an ADD whose plug is under way when AttachTimeout
// passes waits for it (up to PlugGrace more) instead of failing in the
// middle of the plug; one whose plug has not begun fails at
// AttachTimeout, and one whose plug outlasts the grace fails then.
func TestAddPlugGrace(t *testing.T) {
	const attachTimeout, grace = 100 * time.Millisecond, 400 * time.Millisecond
	for _, tc := range []struct {
		name     string
		plugging bool
		// returns: the fake plug ends once the daemon has asked whether
		// it is under way (which it does at AttachTimeout); otherwise it
		// never ends.
		returns bool
		code    uint
		least   time.Duration // the ADD takes at least this long
	}{
		{name: "plug under way at the timeout, then done", plugging: true, returns: true, least: attachTimeout},
		{name: "plug not begun", code: cniwire.ErrPlugFailed, least: attachTimeout},
		{name: "plug under way past the grace", plugging: true, code: cniwire.ErrPlugFailed, least: attachTimeout + grace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeDaemon(t, 200*time.Millisecond, fakePod("u1", annotation(t, nil)))
			e.d.cfg.AttachTimeout, e.d.cfg.PlugGrace = attachTimeout, grace
			e.ag.plugging, e.ag.asked, e.ag.wait = tc.plugging, make(chan struct{}), make(chan struct{})
			if tc.returns {
				e.ag.wait = e.ag.asked
			}
			start := time.Now()
			code, out := e.do(t, "ADD", "c1", "u1", conf)
			took := time.Since(start)
			if code != tc.code {
				t.Fatalf("code %d, want %d: %s", code, tc.code, out)
			}
			if took < tc.least {
				t.Fatalf("ADD answered after %s, want at least %s", took, tc.least)
			}
			if tc.code != 0 && !strings.Contains(string(out), "deadline exceeded") {
				t.Fatalf("error %s does not say the deadline passed", out)
			}
		})
	}
}
