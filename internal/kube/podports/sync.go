package podports

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/kube/ctrl"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

const resyncKey = "resync"

func everything() labels.Selector { return labels.Everything() }

// PortID is the id of the port of the pod with this UID.
func PortID(uid types.UID) string { return podnet.PortID(string(uid)) }

// SubnetID is the id of the subnet of the namespace with this UID.
func SubnetID(uid types.UID) string { return "ns-" + string(uid) }

// eligible reports whether a pod should have a port: scheduled, not on
// the host's network, not finished.
func eligible(p *corev1.Pod) bool {
	return p.Spec.NodeName != "" && !p.Spec.HostNetwork &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// annotated reports whether a pod's annotation is, all of it, the one
// the watcher last wrote (or found in place) for the pod's port: its
// addresses, MAC, host and gateways as well as its pod UID and port id,
// which a pod's owner can keep while editing the rest. Without a record
// (a watcher that has just started or taken the lease) only the pod UID
// and port id are checked here; the resync, which runs first, compares
// the rest with the listed ports (annotatedAs).
func (w *Watcher) annotated(p *corev1.Pod) bool {
	v, ok := p.Annotations[podnet.Annotation]
	if !ok {
		return false
	}
	w.wmu.Lock()
	rec, recorded := w.written[p.UID]
	w.wmu.Unlock()
	if recorded {
		if sha256.Sum256([]byte(v)) == rec {
			return true // the very value written: no need to decode it
		}
		d, ok := digestOf(v)
		return ok && d == rec
	}
	ns, err := podnet.Decode(v)
	if err != nil {
		return false
	}
	n, _ := ns.Default()
	return n.PodUID == string(p.UID) && n.PortID == PortID(p.UID)
}

// annotatedAs reports whether a pod's annotation is what the watcher
// would write for port (listed by the resync) in the pod's namespace's
// subnet (from subnets, by id), and records it when it is.
func (w *Watcher) annotatedAs(p *corev1.Pod, port *controllerapi.Port, subnets map[string]*controllerapi.Subnet) bool {
	ns, err := w.nss.Get(p.Namespace)
	if err != nil {
		return false
	}
	sn := subnets[SubnetID(ns.UID)]
	if sn == nil {
		return false
	}
	want, err := annotationFor(port, sn, p.UID)
	if err != nil {
		return false
	}
	if !sameAnnotation(p.Annotations[podnet.Annotation], want) {
		return false
	}
	w.remember(p.UID, want)
	return true
}

// digestOf is the digest of an annotation value's content: two values
// that decode alike have one digest. ok is false for a value that does
// not decode.
func digestOf(v string) (d [sha256.Size]byte, ok bool) {
	ns, err := podnet.Decode(v)
	if err != nil {
		return d, false
	}
	c, err := podnet.Encode(ns)
	if err != nil {
		return d, false
	}
	return sha256.Sum256([]byte(c)), true
}

// remember records the annotation written (or found in place) for the
// pod with this UID; forget drops the record with the pod's port.
func (w *Watcher) remember(uid types.UID, val string) {
	d, ok := digestOf(val)
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if ok {
		w.written[uid] = d
	} else {
		delete(w.written, uid)
	}
}

func (w *Watcher) forget(uid types.UID) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	delete(w.written, uid)
}

// podKey is the one queue key of everything done for the pod with this
// UID (its port made, annotated or deleted): the queue never syncs a key
// on two workers at once, so a sync that read the pod before its deletion
// is always followed by one that sees it gone.
func podKey(uid types.UID) string { return "p/" + string(uid) }

func (w *Watcher) onPod(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	switch {
	case eligible(p) && !w.annotated(p):
		w.q.Add(podKey(p.UID))
	case !eligible(p) && p.Spec.NodeName != "" && !p.Spec.HostNetwork:
		w.q.Add(podKey(p.UID)) // finished: its port goes
	}
}

func (w *Watcher) onPodDelete(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if p, ok := o.(*corev1.Pod); ok && !p.Spec.HostNetwork {
		w.q.Add(podKey(p.UID))
	}
}

func (w *Watcher) onNamespace(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if n, ok := o.(*corev1.Namespace); ok {
		w.q.Add("n/" + n.Name)
	}
}

// onNodeUpdate requeues a node's pods when its host id changes.
func (w *Watcher) onNodeUpdate(old, o any) {
	on, ok1 := old.(*corev1.Node)
	nn, ok2 := o.(*corev1.Node)
	if !ok1 || !ok2 || hostIDOf(on) == hostIDOf(nn) {
		return
	}
	pods, err := w.pods.List(everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		if p.Spec.NodeName == nn.Name {
			w.q.Add(podKey(p.UID))
		}
	}
}

func hostIDOf(n *corev1.Node) string {
	if id := n.Annotations[podnet.HostIDAnnotation]; id != "" {
		return id
	}
	return n.Name
}

func (w *Watcher) sync(ctx context.Context, key string) error {
	kind, rest, _ := strings.Cut(key, "/")
	switch kind {
	case "p":
		return w.syncUID(ctx, types.UID(rest))
	case "n":
		return w.syncNamespace(ctx, rest)
	case resyncKey:
		return w.resync(ctx)
	}
	return nil
}

// syncUID gives the eligible pod of a UID its port and annotation, and
// deletes the port of a UID that has no eligible pod.
func (w *Watcher) syncUID(ctx context.Context, uid types.UID) error {
	objs, err := w.podIdx.ByIndex(uidIndex, string(uid))
	if err != nil {
		return err
	}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && eligible(p) {
			return w.syncPod(ctx, p)
		}
	}
	return w.deletePort(ctx, uid)
}

// syncPod gives an eligible pod its port and annotation. Only the sync of
// the pod's key calls it.
func (w *Watcher) syncPod(ctx context.Context, pod *corev1.Pod) error {
	nsName, name := pod.Namespace, pod.Name
	ns, err := w.nss.Get(nsName)
	if err != nil {
		return fmt.Errorf("pod %s/%s: namespace: %w", nsName, name, err)
	}
	if ns.DeletionTimestamp != nil {
		return nil // no new ports in a terminating namespace
	}
	sn, err := w.ensureSubnet(ctx, ns)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", nsName, name, err)
	}
	host := pod.Spec.NodeName
	if node, err := w.nodes.Get(host); err == nil {
		host = hostIDOf(node)
	}
	port, err := w.ensurePort(ctx, pod, sn, host)
	if errors.Is(err, kerrors.NotFound) {
		// The subnet went other than by its namespace's deletion: make
		// it again on the retry.
		w.forgetSubnet(sn.ID)
	}
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", nsName, name, err)
	}
	val, err := annotationFor(port, sn, pod.UID)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", nsName, name, err)
	}
	// Recorded before the patch: the pod's update event that the patch
	// brings finds its annotation in place (a failed patch leaves a
	// record the pod does not match, so its next event syncs it again).
	w.remember(pod.UID, val)
	if sameAnnotation(pod.Annotations[podnet.Annotation], val) {
		return nil
	}
	return w.patchAnnotation(ctx, pod, val)
}

// ensurePort creates the pod's port, or adopts the one an earlier run
// made. A port found in another subnet is recreated; one bound to another
// host id (the node's agent restarted with another) is rebound in place,
// keeping its address and MAC: the pod's sandbox, plugged once, keeps
// them.
func (w *Watcher) ensurePort(ctx context.Context, pod *corev1.Pod, sn *controllerapi.Subnet, host string) (*controllerapi.Port, error) {
	id := PortID(pod.UID)
	want := controllerapi.Port{
		ID: id, Name: "k8s_" + pod.Namespace + "_" + pod.Name, NetworkID: sn.ID,
		DeviceID: string(pod.UID), DeviceOwner: Owner, BindingHostID: host,
		Description: fmt.Sprintf("pod %s/%s on node %s", pod.Namespace, pod.Name, pod.Spec.NodeName),
	}
	for attempt := 0; ; attempt++ {
		p, err := w.c.CreatePort(ctx, w.cfg.Project, want)
		if err == nil {
			w.log.Debug("port created", "pod", want.Name, "port", id, "host", host)
			return p, nil
		}
		if !errors.Is(err, kerrors.Conflict) || attempt > 0 {
			return nil, fmt.Errorf("create port %s: %w", id, err)
		}
		p, gerr := w.c.GetPort(ctx, w.cfg.Project, id)
		if errors.Is(gerr, kerrors.NotFound) {
			continue // deleted meanwhile: create again
		}
		if gerr != nil {
			return nil, fmt.Errorf("create port %s: %w", id, gerr)
		}
		if p.BindingHostID == host && inSubnet(p, sn.ID) {
			return p, nil
		}
		if inSubnet(p, sn.ID) {
			w.log.Info("rebinding port to the node's new host id", "port", id, "host", p.BindingHostID, "want", host)
			rp, err := w.c.SetPortBinding(ctx, w.cfg.Project, id, host)
			if err != nil {
				return nil, fmt.Errorf("rebind port %s to host %s: %w", id, host, err)
			}
			return rp, nil
		}
		w.log.Warn("replacing port of another subnet", "port", id, "subnet", p.NetworkID, "want", sn.ID)
		if err := w.c.DeletePort(ctx, w.cfg.Project, id); err != nil && !errors.Is(err, kerrors.NotFound) {
			return nil, fmt.Errorf("replace port %s: %w", id, err)
		}
	}
}

func inSubnet(p *controllerapi.Port, subnetID string) bool {
	for _, f := range p.FixedIPs {
		if f.SubnetID == subnetID {
			return true
		}
	}
	return false
}

// annotationFor builds the annotation value of a port. Pure.
func annotationFor(p *controllerapi.Port, sn *controllerapi.Subnet, uid types.UID) (string, error) {
	cidr, err := netip.ParsePrefix(sn.CIDR)
	if err != nil {
		return "", fmt.Errorf("subnet %s cidr %q: %w", sn.ID, sn.CIDR, err)
	}
	n := podnet.Network{PortID: p.ID, ProjectID: p.ProjectID, SubnetID: sn.ID, MAC: p.MACAddress,
		PodUID: string(uid), HostID: p.BindingHostID}
	for _, f := range p.FixedIPs {
		if f.SubnetID != "" && f.SubnetID != sn.ID {
			continue
		}
		a, err := netip.ParseAddr(f.IPAddress)
		if err != nil {
			return "", fmt.Errorf("port %s address %q: %w", p.ID, f.IPAddress, err)
		}
		n.IPs = append(n.IPs, netip.PrefixFrom(a, cidr.Bits()).String())
	}
	if sn.GatewayIP != "" {
		n.Gateways = []string{sn.GatewayIP}
	}
	return podnet.Encode(podnet.Networks{podnet.DefaultNetwork: n})
}

// sameAnnotation compares two annotation values by content.
func sameAnnotation(have, want string) bool {
	if have == want {
		return true
	}
	a, err1 := podnet.Decode(have)
	b, err2 := podnet.Decode(want)
	return err1 == nil && err2 == nil && reflect.DeepEqual(a, b)
}

// patchAnnotation writes the annotation with the pod's UID as a
// precondition, so that a pod replaced under the same name is never
// given another pod's port.
func (w *Watcher) patchAnnotation(ctx context.Context, pod *corev1.Pod, val string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]string{podnet.Annotation: val}}})
	if err != nil {
		return err
	}
	_, err = w.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // gone or replaced: the UID key cleans up
	case err != nil:
		return fmt.Errorf("annotate pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// liveUID reports whether an eligible pod has this UID.
func (w *Watcher) liveUID(uid types.UID) (bool, error) {
	objs, err := w.podIdx.ByIndex(uidIndex, string(uid))
	if err != nil {
		return false, err
	}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && eligible(p) {
			return true, nil
		}
	}
	return false, nil
}

// collectUID deletes the port of a pod UID unless an eligible pod still
// has that UID. (A sync of the pod's key that raced with this, having
// read the pod before it went, is followed by the sync its delete event
// queued.)
func (w *Watcher) collectUID(ctx context.Context, uid types.UID) error {
	if live, err := w.liveUID(uid); err != nil || live {
		return err
	}
	return w.deletePort(ctx, uid)
}

// deletePort deletes the port of a pod UID; a missing port is success.
func (w *Watcher) deletePort(ctx context.Context, uid types.UID) error {
	w.forget(uid)
	err := w.c.DeletePort(ctx, w.cfg.Project, PortID(uid))
	if err == nil {
		w.log.Debug("port deleted", "port", PortID(uid))
	}
	if err != nil && !errors.Is(err, kerrors.NotFound) {
		return fmt.Errorf("delete port %s: %w", PortID(uid), err)
	}
	return nil
}

// ensureSubnet returns the namespace's subnet, creating it (with the
// first free range of the pool) when missing.
func (w *Watcher) ensureSubnet(ctx context.Context, ns *corev1.Namespace) (*controllerapi.Subnet, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sn := w.subnets[string(ns.UID)]; sn != nil {
		return sn, nil
	}
	id := SubnetID(ns.UID)
	for attempt := 0; attempt < 5; attempt++ {
		sn, err := w.c.GetSubnet(ctx, w.cfg.Project, id)
		if err == nil {
			w.subnets[string(ns.UID)] = sn
			return sn, nil
		}
		if !errors.Is(err, kerrors.NotFound) {
			return nil, fmt.Errorf("subnet of namespace %s: %w", ns.Name, err)
		}
		all, err := w.c.ListSubnets(ctx, w.cfg.Project, w.cfg.VPC)
		if err != nil {
			return nil, fmt.Errorf("subnet of namespace %s: %w", ns.Name, err)
		}
		var used []netip.Prefix
		for _, s := range all {
			if p, err := netip.ParsePrefix(s.CIDR); err == nil {
				used = append(used, p)
			}
		}
		cidr, err := nextFree(w.cfg.Pool, w.cfg.SubnetBits, used)
		if err != nil {
			return nil, fmt.Errorf("subnet of namespace %s: %w", ns.Name, err)
		}
		sn, err = w.c.CreateSubnet(ctx, w.cfg.Project, controllerapi.Subnet{ID: id, Name: ns.Name,
			NetworkID: w.cfg.VPC, CIDR: cidr.String(),
			Description: fmt.Sprintf("kubernetes namespace %s (uid %s)", ns.Name, ns.UID)})
		if err == nil {
			w.log.Info("namespace subnet created", "namespace", ns.Name, "subnet", id, "cidr", sn.CIDR)
			w.subnets[string(ns.UID)] = sn
			return sn, nil
		}
		if !errors.Is(err, kerrors.Conflict) {
			return nil, fmt.Errorf("create subnet of namespace %s: %w", ns.Name, err)
		}
		// Ours made by an earlier run, or a range taken meanwhile: look again.
	}
	return nil, kerrors.New(kerrors.Conflict, "subnet of namespace %s: the pool keeps changing", ns.Name)
}

// syncNamespace makes sure a live namespace has its subnet and removes
// the subnets of namespaces of that name that are gone (once their ports
// are gone: the controller refuses before).
func (w *Watcher) syncNamespace(ctx context.Context, name string) error {
	var live *corev1.Namespace
	if ns, err := w.nss.Get(name); err == nil && ns.DeletionTimestamp == nil {
		live = ns
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if live != nil {
		if _, err := w.ensureSubnet(ctx, live); err != nil {
			return err
		}
	}
	all, err := w.c.ListSubnets(ctx, w.cfg.Project, w.cfg.VPC)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	var busy error
	for _, s := range all {
		if s.Name != name || !strings.HasPrefix(s.ID, "ns-") || (live != nil && s.ID == SubnetID(live.UID)) {
			continue
		}
		// Ports of pods that are gone go first (a missed delete event).
		if err := w.collectPorts(ctx, s.ID); err != nil {
			return err
		}
		err := w.c.DeleteSubnet(ctx, w.cfg.Project, s.ID)
		switch {
		case err == nil:
			w.log.Info("namespace subnet deleted", "namespace", name, "subnet", s.ID, "cidr", s.CIDR)
		case errors.Is(err, kerrors.NotFound):
		case errors.Is(err, kerrors.Conflict):
			// Its pods are still terminating: an expected wait, logged
			// at debug level unless it lasts (ctrl.ErrWaiting).
			busy = fmt.Errorf("namespace %s: subnet %s still has ports: %w (%w)", name, s.ID, err, ctrl.ErrWaiting)
		default:
			return fmt.Errorf("namespace %s: delete subnet %s: %w", name, s.ID, err)
		}
		w.forgetSubnet(s.ID)
	}
	return busy // retried with backoff until the pods are gone
}

// forgetSubnet drops a subnet from the cache.
func (w *Watcher) forgetSubnet(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for uid, c := range w.subnets {
		if c.ID == id {
			delete(w.subnets, uid)
		}
	}
}

// collectPorts deletes the watcher's ports in a subnet (all subnets when
// subnetID is empty) whose pod UID has no eligible pod.
func (w *Watcher) collectPorts(ctx context.Context, subnetID string) error {
	ports, err := w.c.ListPorts(ctx, w.cfg.Project, controllerapi.PortFilter{NetworkID: subnetID})
	if err != nil {
		return fmt.Errorf("list ports: %w", err)
	}
	for _, p := range ports {
		if p.DeviceOwner != Owner || p.ID != PortID(types.UID(p.DeviceID)) {
			continue
		}
		if err := w.collectUID(ctx, types.UID(p.DeviceID)); err != nil {
			return err
		}
	}
	return nil
}

// resync is the full level check: ports without an eligible pod go, and
// every pod and namespace is synced again (pods whose annotation is in
// place and whose port exists cost nothing).
func (w *Watcher) resync(ctx context.Context) error {
	ports, err := w.c.ListPorts(ctx, w.cfg.Project, controllerapi.PortFilter{})
	if err != nil {
		return fmt.Errorf("resync: list ports: %w", err)
	}
	have := map[string]*controllerapi.Port{}
	for i, p := range ports {
		if p.DeviceOwner != Owner || p.ID != PortID(types.UID(p.DeviceID)) {
			continue
		}
		have[p.ID] = &ports[i]
		live, err := w.liveUID(types.UID(p.DeviceID))
		if err != nil {
			return err
		}
		if !live {
			w.q.Add(podKey(types.UID(p.DeviceID))) // its pod is gone
		}
	}
	// Subnets are listed once here; only the namespaces whose subnet is
	// missing, or that have a stale one, are synced (each such sync lists
	// them again).
	subs, err := w.c.ListSubnets(ctx, w.cfg.Project, w.cfg.VPC)
	if err != nil {
		return fmt.Errorf("resync: list subnets: %w", err)
	}
	exists := map[string]bool{}
	byID := map[string]*controllerapi.Subnet{}
	for i, s := range subs {
		exists[s.ID] = true
		byID[s.ID] = &subs[i]
	}
	// A pod is synced unless its port exists and its annotation is, all
	// of it, what the watcher would write for that port now: one whose
	// addresses, MAC or host were edited (by the pod's owner, or while
	// the watcher was down) is rewritten.
	pods, err := w.pods.List(everything())
	if err != nil {
		return err
	}
	for _, p := range pods {
		if !eligible(p) {
			continue
		}
		if port := have[PortID(p.UID)]; port == nil || !w.annotatedAs(p, port, byID) {
			w.q.Add(podKey(p.UID))
		}
	}
	w.mu.Lock()
	for uid, c := range w.subnets {
		if !exists[c.ID] {
			delete(w.subnets, uid) // removed other than by its namespace's deletion
		}
	}
	w.mu.Unlock()
	nss, err := w.nss.List(everything())
	if err != nil {
		return err
	}
	live := map[string]string{} // namespace name -> its subnet id
	for _, n := range nss {
		if n.DeletionTimestamp == nil {
			live[n.Name] = SubnetID(n.UID)
		}
		if n.DeletionTimestamp != nil || !exists[SubnetID(n.UID)] {
			w.q.Add("n/" + n.Name)
		}
	}
	for _, s := range subs {
		if strings.HasPrefix(s.ID, "ns-") && live[s.Name] != s.ID {
			w.q.Add("n/" + s.Name) // of a namespace that is gone or was replaced
		}
	}
	return nil
}
