package podports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"

	"kurma.dev/kurma/internal/kube/ctrl"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// fakeController is an in-memory controller for the watcher's
// pure-logic tests: ports and subnets by id, addresses handed out in
// order. Hooks, when set, run at the start of a call.
type fakeController struct {
	mu          sync.Mutex
	ports       map[string]controllerapi.Port
	subnets     map[string]controllerapi.Subnet
	next        int
	listSubnets int // ListSubnets calls
	onCreate    func(p controllerapi.Port)
	calls       []string // "create <id>", "delete <id>" of ports that changed the store
}

func newFakeController() *fakeController {
	return &fakeController{ports: map[string]controllerapi.Port{}, subnets: map[string]controllerapi.Subnet{}}
}

func (f *fakeController) GetProject(context.Context, string) (*controllerapi.Project, error) {
	return &controllerapi.Project{ID: "k8s"}, nil
}
func (f *fakeController) CreateProject(_ context.Context, p controllerapi.Project) (*controllerapi.Project, error) {
	return &p, nil
}
func (f *fakeController) GetVPC(context.Context, string, string) (*controllerapi.VPC, error) {
	return &controllerapi.VPC{ID: "k8s-pods"}, nil
}
func (f *fakeController) CreateVPC(_ context.Context, _ string, v controllerapi.VPC) (*controllerapi.VPC, error) {
	return &v, nil
}

func (f *fakeController) GetSubnet(_ context.Context, _, id string) (*controllerapi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.subnets[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "subnet %s", id)
	}
	return &s, nil
}

func (f *fakeController) ListSubnets(context.Context, string, string) ([]controllerapi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listSubnets++
	var out []controllerapi.Subnet
	for _, s := range f.subnets {
		out = append(out, s)
	}
	return out, nil
}

func (f *fakeController) CreateSubnet(_ context.Context, _ string, s controllerapi.Subnet) (*controllerapi.Subnet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subnets[s.ID]; ok {
		return nil, kerrors.New(kerrors.Conflict, "subnet %s", s.ID)
	}
	s.GatewayIP = netip.MustParsePrefix(s.CIDR).Addr().Next().String()
	f.subnets[s.ID] = s
	return &s, nil
}

func (f *fakeController) DeleteSubnet(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subnets[id]; !ok {
		return kerrors.New(kerrors.NotFound, "subnet %s", id)
	}
	for _, p := range f.ports {
		if p.NetworkID == id {
			return kerrors.New(kerrors.Conflict, "subnet %s has ports", id)
		}
	}
	delete(f.subnets, id)
	return nil
}

func (f *fakeController) GetPort(_ context.Context, _, id string) (*controllerapi.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.ports[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "port %s", id)
	}
	return &p, nil
}

func (f *fakeController) ListPorts(_ context.Context, _ string, flt controllerapi.PortFilter) ([]controllerapi.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []controllerapi.Port
	for _, p := range f.ports {
		if flt.NetworkID == "" || p.NetworkID == flt.NetworkID {
			out = append(out, p)
		}
	}
	return out, nil
}

func (f *fakeController) CreatePort(_ context.Context, _ string, p controllerapi.Port) (*controllerapi.Port, error) {
	if f.onCreate != nil {
		f.onCreate(p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.ports[p.ID]; ok {
		return nil, kerrors.New(kerrors.Conflict, "port %s", p.ID)
	}
	sn, ok := f.subnets[p.NetworkID]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "subnet %s", p.NetworkID)
	}
	f.next++
	a := netip.MustParsePrefix(sn.CIDR).Addr()
	for range f.next + 1 {
		a = a.Next()
	}
	p.ProjectID = "k8s"
	p.MACAddress = fmt.Sprintf("02:00:00:00:%02x:%02x", f.next>>8, f.next&0xff)
	p.FixedIPs = []controllerapi.FixedIP{{SubnetID: sn.ID, IPAddress: a.String()}}
	f.ports[p.ID] = p
	f.calls = append(f.calls, "create "+p.ID)
	return &p, nil
}

func (f *fakeController) DeletePort(_ context.Context, _, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.ports[id]; !ok {
		return kerrors.New(kerrors.NotFound, "port %s", id)
	}
	delete(f.ports, id)
	f.calls = append(f.calls, "delete "+id)
	return nil
}

func (f *fakeController) SetPortBinding(_ context.Context, _, id, host string) (*controllerapi.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.ports[id]
	if !ok {
		return nil, kerrors.New(kerrors.NotFound, "port %s", id)
	}
	p.BindingHostID = host
	f.ports[id] = p
	f.calls = append(f.calls, "rebind "+id+" "+host)
	return &p, nil
}

func (f *fakeController) hasPort(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.ports[id]
	return ok
}

// trackedQueue wraps the watcher's queue to tell a test which keys are
// being synced, and when keys are added or done.
type trackedQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu       sync.Mutex
	inflight map[string]int
	// added holds the keys added and not yet handed to a worker: the
	// queue's own Len drops when a worker takes a key, before inflight
	// counts it, and idle must not see that gap as idle.
	added  map[string]bool
	events chan string // "add <key>", "done <key>"
}

func (q *trackedQueue) Add(k string) {
	q.mu.Lock()
	if q.added == nil {
		q.added = map[string]bool{}
	}
	q.added[k] = true
	q.mu.Unlock()
	q.TypedRateLimitingInterface.Add(k)
	q.events <- "add " + k
}

func (q *trackedQueue) Get() (string, bool) {
	k, quit := q.TypedRateLimitingInterface.Get()
	if !quit {
		q.mu.Lock()
		q.inflight[k]++
		delete(q.added, k)
		q.mu.Unlock()
	}
	return k, quit
}

func (q *trackedQueue) Done(k string) {
	q.TypedRateLimitingInterface.Done(k) // a key added meanwhile is queued now
	q.mu.Lock()
	q.inflight[k]--
	if q.inflight[k] == 0 {
		delete(q.inflight, k)
	}
	q.mu.Unlock()
	q.events <- "done " + k
}

func (q *trackedQueue) busy(k string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.inflight[k] > 0
}

func (q *trackedQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.inflight) == 0 && len(q.added) == 0 && q.TypedRateLimitingInterface.Len() == 0
}

// fakeEnv is a watcher on a fake clientset and a fake controller.
type fakeEnv struct {
	t    *testing.T
	kube *fake.Clientset
	fc   *fakeController
	w    *Watcher
	q    *trackedQueue
}

func startFake(t *testing.T, objs ...any) *fakeEnv {
	t.Helper()
	kube := fake.NewClientset()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Node:
			_, err = kube.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Namespace:
			_, err = kube.CoreV1().Namespaces().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = kube.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	fc := newFakeController()
	q := &trackedQueue{inflight: map[string]int{}, events: make(chan string, 1<<12)}
	w, err := New(Config{Kube: kube, Controller: fc, Resync: time.Hour, Workers: 4,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		wrapQueue: func(in ctrl.Queue) ctrl.Queue { q.TypedRateLimitingInterface = in; return q }})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEnv{t: t, kube: kube, fc: fc, w: w, q: q}
}

// run starts the watcher until the test ends.
func (e *fakeEnv) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
}

// waitEvent waits for a queue event.
func (e *fakeEnv) waitEvent(what string, ok func(ev string) bool) {
	e.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-e.q.events:
			if ok(ev) {
				return
			}
		case <-timeout:
			e.t.Fatalf("no %s within 20s", what)
		}
	}
}

// waitIdle waits until no key is queued or being synced.
func (e *fakeEnv) waitIdle() {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !e.q.idle() {
		if time.Now().After(deadline) {
			e.t.Fatal("queue not idle within 20s")
		}
		select {
		case <-e.q.events:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func testPod(ns, name, uid, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
}

func testNS(name, uid string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
}

// TestDeletedPodPortNotRecreated: a pod deleted while its port is being
// created loses that port. (Before the pod's syncs shared one key, the
// deletion's sync ran on another worker, found no port yet, and the
// in-flight create then made one that stayed until the next resync.)
func TestDeletedPodPortNotRecreated(t *testing.T) {
	e := startFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, testNS("ns", "nsuid"),
		testPod("ns", "p", "u1", "n1"))
	entered, release := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	e.fc.onCreate = func(p controllerapi.Port) {
		if p.ID == PortID("u1") {
			once.Do(func() { close(entered); <-release })
		}
	}
	e.run()
	t.Cleanup(free) // before Run's cleanup waits for the workers
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("port of p not being created within 20s")
	}
	var syncing string // the key whose sync is creating the port
	e.q.mu.Lock()
	for k := range e.q.inflight {
		if strings.HasPrefix(k, "p/") { // a pod's key
			syncing = k
		}
	}
	e.q.mu.Unlock()
	for len(e.q.events) > 0 {
		<-e.q.events // what the start queued
	}
	if err := e.kube.CoreV1().Pods("ns").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for live, _ := e.w.liveUID("u1"); live; live, _ = e.w.liveUID("u1") {
		if time.Now().After(deadline) {
			t.Fatal("deleted pod still in the cache after 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The deletion queues a key. On the same key as the in-flight sync, the
	// queue holds it back until that sync is done; on another key, it runs
	// now: wait for it to finish before the create goes on.
	var deleted string
	e.waitEvent("key of the deleted pod", func(ev string) bool {
		if len(ev) > 4 && ev[:4] == "add " && ev[4:] != resyncKey {
			deleted = ev[4:]
			return true
		}
		return false
	})
	t.Logf("in flight %q, deletion queued %q", syncing, deleted)
	if deleted != syncing {
		e.waitEvent("sync of "+deleted, func(ev string) bool { return ev == "done "+deleted && !e.q.busy(deleted) })
	}
	free()
	e.waitIdle()
	if e.fc.hasPort(PortID("u1")) {
		t.Fatalf("port %s of the deleted pod is left behind", PortID("u1"))
	}
}

// TestResyncListsSubnetsOnce: a resync of a cluster of 30 namespaces whose
// subnets are in place lists the subnets once (it used to sync every
// namespace, each listing all subnets: N² in namespaces).
func TestResyncListsSubnetsOnce(t *testing.T) {
	var objs []any
	for i := range 30 {
		objs = append(objs, testNS(fmt.Sprintf("ns%d", i), fmt.Sprintf("nsuid%d", i)))
	}
	e := startFake(t, objs...)
	e.run()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.fc.mu.Lock()
		n := len(e.fc.subnets)
		e.fc.mu.Unlock()
		if n == 30 && e.q.idle() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 30 subnets after 20s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.fc.mu.Lock()
	e.fc.listSubnets = 0
	e.fc.mu.Unlock()
	e.w.q.Add(resyncKey)
	e.waitIdle()
	e.fc.mu.Lock()
	defer e.fc.mu.Unlock()
	if e.fc.listSubnets != 1 {
		t.Fatalf("a resync of 30 namespaces listed the subnets %d times, want 1", e.fc.listSubnets)
	}
}

// TestSubnetRemovedElsewhere: a namespace's subnet removed other than by
// the namespace's deletion (by an operator, with its ports) is made again
// for the namespace's next pod, instead of the cache naming it forever.
func TestSubnetRemovedElsewhere(t *testing.T) {
	e := startFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, testNS("ns", "nsuid"),
		testPod("ns", "p1", "u1", "n1"))
	e.run()
	waitPort := func(uid string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !e.fc.hasPort(PortID(types.UID(uid))) {
			if time.Now().After(deadline) {
				t.Fatalf("no port for %s within 20s", uid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitPort("u1")
	e.waitIdle()
	e.fc.mu.Lock()
	clear(e.fc.ports)
	clear(e.fc.subnets)
	e.fc.mu.Unlock()
	if _, err := e.kube.CoreV1().Pods("ns").Create(context.Background(), testPod("ns", "p2", "u2", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPort("u2")
}

// TestDeletedNamespaceWaitsForPods: the subnet of a namespace deleted
// while its pods still hold ports stays, and its sync fails with
// ctrl.ErrWaiting (retried, logged at debug level: the pods are
// terminating), not as a failure; once the pods are gone it goes.
func TestDeletedNamespaceWaitsForPods(t *testing.T) {
	e := startFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, testNS("ns", "nsuid"),
		testPod("ns", "p", "u1", "n1"))
	e.run()
	deadline := time.Now().Add(20 * time.Second)
	for !e.fc.hasPort(PortID("u1")) {
		if time.Now().After(deadline) {
			t.Fatal("no port for p within 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.waitIdle()
	// The fake clientset deletes the namespace at once and leaves its pod,
	// as a namespace whose pods are still terminating looks to the watcher.
	if err := e.kube.CoreV1().Namespaces().Delete(context.Background(), "ns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for _, err := e.w.nss.Get("ns"); err == nil; _, err = e.w.nss.Get("ns") {
		if time.Now().After(deadline) {
			t.Fatal("deleted namespace still in the cache after 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	err := e.w.syncNamespace(t.Context(), "ns")
	if !errors.Is(err, ctrl.ErrWaiting) || !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("sync of a deleted namespace with a live pod: %v; want ErrWaiting and Conflict", err)
	}
	e.fc.mu.Lock()
	n := len(e.fc.subnets)
	e.fc.mu.Unlock()
	if n != 1 || !e.fc.hasPort(PortID("u1")) {
		t.Fatalf("%d subnets, port %t; want the subnet and the port kept", n, e.fc.hasPort(PortID("u1")))
	}
	if err := e.kube.CoreV1().Pods("ns").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		e.w.q.Add("n/ns") // as the resync does (the retry's backoff may be longer)
		e.waitEvent("sync of the namespace", func(ev string) bool { return ev == "done n/ns" })
		e.fc.mu.Lock()
		n := len(e.fc.subnets)
		e.fc.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("subnet of the deleted namespace still there 20s after its pod went")
		}
	}
}

// TestCompactPod: the pod cache keeps what the watcher reads, nothing
// else, and the transform is idempotent.
func TestCompactPod(t *testing.T) {
	p := testPod("ns", "p", "u1", "n1")
	p.ResourceVersion = "7"
	p.Labels = map[string]string{"app": "x"}
	p.Annotations = map[string]string{"other": "y", "kurma.dev/pod-networks": "{}"}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = "10.0.0.1"
	o, err := compactPod(p)
	if err != nil {
		t.Fatal(err)
	}
	c := o.(*corev1.Pod)
	want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1", ResourceVersion: "7",
		Annotations: map[string]string{"kurma.dev/pod-networks": "{}"}},
		Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("compact pod %+v, want %+v", c, want)
	}
	again, _ := compactPod(c)
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("not idempotent: %+v", again)
	}
	if !eligible(c) {
		t.Fatal("compact pod not eligible")
	}
}

// TestForgedAnnotationRewritten: an annotation whose pod UID and port id
// are right but whose addresses, MAC, host or gateway were edited (by the
// pod's owner, who may patch the pod) is rewritten from the port: when
// the edit comes while the watcher runs (the pod's update event), and
// when the watcher finds it at start (its first resync compares the whole
// annotation with the listed port). A pod whose annotation is in place
// is not patched.
func TestForgedAnnotationRewritten(t *testing.T) {
	subnet := controllerapi.Subnet{ID: SubnetID("nsuid"), Name: "ns", NetworkID: "k8s-pods", CIDR: "10.32.0.0/16", GatewayIP: "10.32.0.1"}
	port := func(uid string, n int) controllerapi.Port {
		return controllerapi.Port{ID: PortID(types.UID(uid)), ProjectID: "k8s", NetworkID: subnet.ID, DeviceID: uid,
			DeviceOwner: Owner, BindingHostID: "n1", MACAddress: fmt.Sprintf("02:00:00:00:00:%02x", n),
			FixedIPs: []controllerapi.FixedIP{{SubnetID: subnet.ID, IPAddress: fmt.Sprintf("10.32.0.%d", n)}}}
	}
	valueOf := func(t *testing.T, p controllerapi.Port) string {
		t.Helper()
		v, err := annotationFor(&p, &subnet, types.UID(p.DeviceID))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	forge := func(t *testing.T, v string, edit func(n *podnet.Network)) string {
		t.Helper()
		nets, err := podnet.Decode(v)
		if err != nil {
			t.Fatal(err)
		}
		n := nets[podnet.DefaultNetwork]
		edit(&n)
		nets[podnet.DefaultNetwork] = n
		out, err := podnet.Encode(nets)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	annotation := func(e *fakeEnv, name string) string {
		p, err := e.kube.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		return p.Annotations[podnet.Annotation]
	}
	waitAnnotation := func(e *fakeEnv, name, want string) {
		e.t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := annotation(e, name); !sameAnnotation(got, want); got = annotation(e, name) {
			if time.Now().After(deadline) {
				e.t.Fatalf("pod %s annotated %s after 10s, want %s", name, got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	patchesOf := func(e *fakeEnv, name string) int {
		n := 0
		for _, a := range e.kube.Actions() {
			if a, ok := a.(k8stesting.PatchAction); ok && a.GetName() == name {
				n++
			}
		}
		return n
	}
	node, ns := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, testNS("ns", "nsuid")
	for _, tc := range []struct {
		name string
		edit func(n *podnet.Network)
	}{
		{"address", func(n *podnet.Network) { n.IPs = []string{"10.32.0.200/16"} }},
		{"MAC", func(n *podnet.Network) { n.MAC = "02:00:00:00:00:c8" }},
		{"host", func(n *podnet.Network) { n.HostID = "n2" }},
		{"gateway", func(n *podnet.Network) { n.Gateways = []string{"10.32.0.254"} }},
		{"routes", func(n *podnet.Network) { n.Routes = []podnet.Route{{Dest: "10.96.0.0/12"}} }},
	} {
		t.Run(tc.name+" edited while the watcher runs", func(t *testing.T) {
			e := startFake(t, node, ns, testPod("ns", "p", "u1", "n1"))
			e.run()
			deadline := time.Now().Add(10 * time.Second)
			for !e.fc.hasPort(PortID("u1")) || annotation(e, "p") == "" {
				if time.Now().After(deadline) {
					t.Fatal("pod p not annotated within 10s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			e.waitIdle()
			want := annotation(e, "p")
			p, err := e.kube.CoreV1().Pods("ns").Get(context.Background(), "p", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Annotations[podnet.Annotation] = forge(t, want, tc.edit)
			if _, err := e.kube.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitAnnotation(e, "p", want)
		})
		t.Run(tc.name+" found at start", func(t *testing.T) {
			forged, good := testPod("ns", "p", "u1", "n1"), testPod("ns", "q", "u2", "n1")
			forged.Annotations = map[string]string{podnet.Annotation: forge(t, valueOf(t, port("u1", 5)), tc.edit)}
			good.Annotations = map[string]string{podnet.Annotation: valueOf(t, port("u2", 6))}
			e := startFake(t, node, ns, forged, good)
			e.fc.subnets[subnet.ID] = subnet
			e.fc.ports[PortID("u1")], e.fc.ports[PortID("u2")] = port("u1", 5), port("u2", 6)
			e.kube.ClearActions()
			e.run()
			waitAnnotation(e, "p", valueOf(t, port("u1", 5)))
			e.waitIdle()
			if n := patchesOf(e, "q"); n != 0 {
				t.Fatalf("pod q, annotated in place, patched %d times", n)
			}
			if n := patchesOf(e, "p"); n != 1 {
				t.Fatalf("pod p patched %d times, want once", n)
			}
		})
	}
}
