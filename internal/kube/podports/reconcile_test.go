package podports

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	listersv1 "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
)

// newSyncWatcher is a watcher whose listers read stores the test fills
// (sample-controller style: no informer runs), on a fake clientset that
// holds the same objects, and a fake controller.
func newSyncWatcher(t *testing.T, objs ...runtime.Object) (*Watcher, *fake.Clientset, *fakeController) {
	t.Helper()
	kube := fake.NewClientset(objs...)
	fc := newFakeController()
	w, err := New(Config{Kube: kube, Controller: fc, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.q.ShutDown)
	nsIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nodeIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			c, _ := compactPod(o)
			err = w.podIdx.Add(c)
		case *corev1.Namespace:
			err = nsIdx.Add(o)
		case *corev1.Node:
			err = nodeIdx.Add(o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	w.nss, w.nodes = listersv1.NewNamespaceLister(nsIdx), listersv1.NewNodeLister(nodeIdx)
	return w, kube, fc
}

// TestSyncUID runs the sync of one pod UID's key against seeded caches
// and checks what it asked of the controller and of the API server.
func TestSyncUID(t *testing.T) {
	ns := testNS("ns", "nsuid")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	nodeWithID := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Annotations: map[string]string{podnet.HostIDAnnotation: "host-7"}}}
	pod := testPod("ns", "p", "u1", "n1")
	withPhase := func(p *corev1.Pod, ph corev1.PodPhase) *corev1.Pod {
		p = p.DeepCopy()
		p.Status.Phase = ph
		return p
	}
	hostNet := pod.DeepCopy()
	hostNet.Spec.HostNetwork = true
	terminating := ns.DeepCopy()
	terminating.DeletionTimestamp = &metav1.Time{}
	subnet := controllerapi.Subnet{ID: SubnetID("nsuid"), Name: "ns", NetworkID: "k8s-pods", CIDR: "10.32.0.0/16", GatewayIP: "10.32.0.1"}
	port := func(host string) controllerapi.Port {
		return controllerapi.Port{ID: PortID("u1"), ProjectID: "k8s", NetworkID: subnet.ID, DeviceID: "u1",
			DeviceOwner: Owner, BindingHostID: host, MACAddress: "02:00:00:00:00:99",
			FixedIPs: []controllerapi.FixedIP{{SubnetID: subnet.ID, IPAddress: "10.32.0.99"}}}
	}
	annotatedPod := func(host string) *corev1.Pod {
		p := pod.DeepCopy()
		pt := port(host)
		v, err := annotationFor(&pt, &subnet, "u1")
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations = map[string]string{podnet.Annotation: v}
		return p
	}
	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		ports   []controllerapi.Port
		wantErr bool
		// calls: the controller's port changes; patched: the API
		// server got the annotation, of a port bound to host.
		calls   []string
		patched bool
		host    string
		// sameAddr: the port keeps the address and MAC it had.
		sameAddr bool
	}{
		{name: "new pod gets port and annotation", objs: []runtime.Object{ns, node, pod},
			calls: []string{"create pod-u1"}, patched: true, host: "n1"},
		{name: "host id of the node annotation", objs: []runtime.Object{ns, nodeWithID, pod},
			calls: []string{"create pod-u1"}, patched: true, host: "host-7"},
		{name: "port and annotation in place: nothing written", objs: []runtime.Object{ns, node, annotatedPod("n1")},
			ports: []controllerapi.Port{port("n1")}},
		{name: "port adopted, annotation written", objs: []runtime.Object{ns, node, pod},
			ports: []controllerapi.Port{port("n1")}, patched: true, host: "n1"},
		// The node's host id changed (its agent restarted with another):
		// the running pod keeps its port, address and MAC, rebound to the
		// new host id. (Recreating the port gave the pod's annotation a
		// new address that its sandbox, plugged once, never got.)
		{name: "port bound to the old host id is rebound in place", objs: []runtime.Object{ns, nodeWithID, annotatedPod("n1")},
			ports: []controllerapi.Port{port("n1")}, calls: []string{"rebind pod-u1 host-7"}, patched: true, host: "host-7",
			sameAddr: true},
		{name: "finished pod loses its port", objs: []runtime.Object{ns, node, withPhase(pod, corev1.PodSucceeded)},
			ports: []controllerapi.Port{port("n1")}, calls: []string{"delete pod-u1"}},
		{name: "failed pod loses its port", objs: []runtime.Object{ns, node, withPhase(pod, corev1.PodFailed)},
			ports: []controllerapi.Port{port("n1")}, calls: []string{"delete pod-u1"}},
		{name: "pod gone: port deleted", objs: []runtime.Object{ns, node},
			ports: []controllerapi.Port{port("n1")}, calls: []string{"delete pod-u1"}},
		{name: "pod gone, no port: nothing", objs: []runtime.Object{ns, node}},
		{name: "host network pod: nothing", objs: []runtime.Object{ns, node, hostNet}},
		{name: "terminating namespace: no new port", objs: []runtime.Object{terminating, node, pod}},
		{name: "namespace not in the cache: retried", objs: []runtime.Object{node, pod}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, kube, fc := newSyncWatcher(t, tc.objs...)
			fc.subnets[subnet.ID] = subnet
			for _, p := range tc.ports {
				fc.ports[p.ID] = p
			}
			kube.ClearActions()
			err := w.syncUID(context.Background(), "u1")
			if (err != nil) != tc.wantErr {
				t.Fatalf("syncUID: %v, want error %t", err, tc.wantErr)
			}
			if !slices.Equal(fc.calls, tc.calls) {
				t.Fatalf("controller port changes %q, want %q", fc.calls, tc.calls)
			}
			var patches []k8stesting.PatchAction
			for _, a := range kube.Actions() {
				switch a := a.(type) {
				case k8stesting.PatchAction:
					patches = append(patches, a)
				default:
					t.Errorf("unexpected API action %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
			if !tc.patched {
				if len(patches) != 0 {
					t.Fatalf("%d patches, want none", len(patches))
				}
				return
			}
			if len(patches) != 1 || patches[0].GetName() != "p" || patches[0].GetPatchType() != types.MergePatchType {
				t.Fatalf("patches %v, want one merge patch of pod p", patches)
			}
			var body struct {
				Metadata struct {
					UID         types.UID         `json:"uid"`
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(patches[0].GetPatch(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Metadata.UID != "u1" {
				t.Fatalf("patch without the pod UID precondition: %s", patches[0].GetPatch())
			}
			nets, err := podnet.Decode(body.Metadata.Annotations[podnet.Annotation])
			if err != nil {
				t.Fatal(err)
			}
			n, _ := nets.Default()
			got := fc.ports[PortID("u1")]
			if tc.sameAddr && (got.MACAddress != port("").MACAddress || got.FixedIPs[0].IPAddress != port("").FixedIPs[0].IPAddress) {
				t.Fatalf("port %+v lost its address or MAC", got)
			}
			if n.PortID != PortID("u1") || n.PodUID != "u1" || n.HostID != tc.host || got.BindingHostID != tc.host ||
				n.MAC != got.MACAddress || len(n.IPs) != 1 || n.IPs[0] != got.FixedIPs[0].IPAddress+"/16" {
				t.Fatalf("annotation %+v for port %+v, host %s", n, got, tc.host)
			}
		})
	}
}

// TestPatchGonePod: a pod deleted or replaced before its annotation is
// written is not an error (its UID's key cleans up).
func TestPatchGonePod(t *testing.T) {
	for _, code := range []string{"notfound", "conflict"} {
		t.Run(code, func(t *testing.T) {
			ns, node, pod := testNS("ns", "nsuid"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, testPod("ns", "p", "u1", "n1")
			w, kube, fc := newSyncWatcher(t, ns, node, pod)
			kube.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				if code == "notfound" {
					return true, nil, errNotFound()
				}
				return true, nil, errConflict()
			})
			if err := w.syncUID(context.Background(), "u1"); err != nil {
				t.Fatalf("syncUID: %v", err)
			}
			if !fc.hasPort(PortID("u1")) {
				t.Fatal("no port")
			}
		})
	}
}

// TestOnNodeUpdate: a node whose host id changes queues its pods' keys,
// and only those; any other change queues nothing.
func TestOnNodeUpdate(t *testing.T) {
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	n1b := n1.DeepCopy()
	n1b.Annotations = map[string]string{podnet.HostIDAnnotation: "h2"}
	n1c := n1.DeepCopy()
	n1c.Labels = map[string]string{"x": "y"}
	for _, tc := range []struct {
		name     string
		old, cur *corev1.Node
		want     []string
	}{
		{"host id changed", n1, n1b, []string{"p/u1", "p/u2"}},
		{"labels changed", n1, n1c, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _, _ := newSyncWatcher(t, testPod("ns", "a", "u1", "n1"), testPod("ns", "b", "u2", "n1"),
				testPod("ns", "c", "u3", "n2"))
			w.onNodeUpdate(tc.old, tc.cur)
			var got []string
			for w.q.Len() > 0 {
				k, _ := w.q.Get()
				got = append(got, k)
				w.q.Done(k)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("queued %v, want %v", got, tc.want)
			}
		})
	}
}

func errNotFound() error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "p")
}

func errConflict() error {
	return apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errors.New("uid precondition"))
}
