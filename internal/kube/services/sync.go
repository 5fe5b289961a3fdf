package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// ConditionFloatingIP is the Service status condition that says whether a
// LoadBalancer Service got its floating IP (False with a reason when the
// requested address is taken or invalid, or the external network is
// missing).
const ConditionFloatingIP = "kurma.dev/FloatingIPAllocated"

// Event reasons.
const (
	ReasonAllocated       = "FloatingIPAllocated"
	ReasonAddressTaken    = "LoadBalancerIPTaken"
	ReasonAddressInvalid  = "LoadBalancerIPInvalid"
	ReasonNoExternal      = "ExternalNetworkMissing"
	retryTakenAddressIn   = 30 * time.Second
	controllerCallTimeout = 30 * time.Second
)

// ours reports whether a LoadBalancer Service's class is served here.
func (r *Reconciler) ours(svc *corev1.Service) bool {
	c := svc.Spec.LoadBalancerClass
	return c == nil || *c == r.cfg.Class
}

func (r *Reconciler) wantsFIP(svc *corev1.Service) bool {
	return svc != nil && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && r.ours(svc) &&
		clusterIP(svc, r.ranges()).IsValid()
}

func (r *Reconciler) slicesOf(key string) []*discoveryv1.EndpointSlice {
	r.sliceMu.Lock()
	keys := slices.Clone(r.slicesBy[key])
	r.sliceMu.Unlock()
	out := make([]*discoveryv1.EndpointSlice, 0, len(keys))
	for _, k := range keys {
		if o, ok, err := r.sliceIdx.GetByKey(k); err == nil && ok {
			// A slice relabelled to another Service since the map was
			// updated is not this one's (its handler enqueues both).
			if s, ok := o.(*sliceObj); ok && s.ns+"/"+s.service == key {
				out = append(out, s.slice())
			}
		}
	}
	return out
}

// service returns the cached Service with this key, or nil.
func (r *Reconciler) service(key string) *corev1.Service {
	o, ok, err := r.svcIdx.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	if s, ok := o.(*svcObj); ok {
		return s.service()
	}
	return nil
}

// sync brings the load balancer and floating IP of one Service in line
// with the API, by level.
func (r *Reconciler) sync(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, controllerCallTimeout)
	defer cancel()
	if _, _, err := cache.SplitMetaNamespaceKey(key); err != nil {
		return nil // not a key of ours
	}
	svc := r.service(key)
	r.mu.Lock()
	vpc := r.vpcPrefix
	var old string
	var oldUID types.UID
	if e, ok := r.lbs[key]; ok {
		old, oldUID = LBID(e.uid), e.uid
	}
	r.mu.Unlock()
	if svc == nil || !r.wantsFIP(svc) || oldUID != "" && oldUID != svc.UID {
		// Nothing of this Service (or of the one it replaced) waits for
		// an address any more.
		r.forgetWaits(key, oldUID)
		if svc != nil && !r.wantsFIP(svc) {
			r.forgetWaits(key, svc.UID)
		}
	}
	var w *wanted
	if svc != nil {
		w = desired(svc, r.slicesOf(key), r.ranges(), vpc, r.hostOf)
	}
	if old != "" && (w == nil || old != w.ID) {
		if err := r.remove(ctx, key, old); err != nil {
			return err
		}
	}
	if w == nil {
		if svc != nil {
			return r.clearStatus(ctx, svc)
		}
		return nil
	}
	for _, m := range w.Warnings {
		r.log.Warn("services: "+m, "service", key)
	}
	if err := r.ensureLB(ctx, key, svc.UID, w); err != nil {
		return err
	}
	if r.wantsFIP(svc) {
		return r.ensureFIP(ctx, key, svc, w.ID)
	}
	if err := r.dropFIP(ctx, w.ID); err != nil {
		return err
	}
	return r.clearStatus(ctx, svc)
}

// remove deletes the floating IP and load balancer with this id.
func (r *Reconciler) remove(ctx context.Context, key, id string) error {
	if err := r.deleteFIP(ctx, id); err != nil {
		return err
	}
	if err := r.c.DeleteLoadBalancer(ctx, r.cfg.Project, id); err != nil && !errors.Is(err, kerrors.NotFound) {
		return fmt.Errorf("delete load balancer %s: %w", id, err)
	}
	r.mu.Lock()
	if e, ok := r.lbs[key]; ok && LBID(e.uid) == id {
		delete(r.lbs, key)
	}
	r.mu.Unlock()
	r.log.Debug("services: removed", "service", key, "id", id)
	return nil
}

func (r *Reconciler) store(key string, uid types.UID, p lbPrint) {
	r.mu.Lock()
	r.lbs[key] = lbEntry{uid: uid, lbPrint: p}
	r.mu.Unlock()
}

// ensureLB sends the smallest change that makes the controller's load
// balancer equal w: none, one member replacement, one update, or a create
// (a create that finds the id taken adopts the load balancer).
// uid is the Service's (w.ID is made of it; the entry keeps the cached
// Service's copy).
func (r *Reconciler) ensureLB(ctx context.Context, key string, uid types.UID, w *wanted) error {
	r.mu.Lock()
	e, ok := r.lbs[key]
	r.mu.Unlock()
	ok = ok && e.uid == uid
	cur := e.lbPrint
	if !ok {
		lb, err := r.c.CreateLoadBalancer(ctx, r.cfg.Project, controllerapi.LoadBalancer{
			ID: w.ID, Name: w.Name, Description: Description, VIPSubnetID: r.ranges().subnetOf(w.VIP, r.cfg.ServiceSubnet), VIPAddress: w.VIP,
			Listeners: w.Listeners, Members: w.Members, SessionPersistence: w.Persistence, Policy: w.Policy,
		})
		if err == nil {
			r.store(key, uid, printOf(lb))
			r.log.Debug("services: created", "service", key, "id", lb.ID, "vip", lb.VIPAddress, "members", len(lb.Members))
			return nil
		}
		if !errors.Is(err, kerrors.Conflict) {
			return fmt.Errorf("create load balancer %s (%s): %w", w.ID, w.VIP, err)
		}
		got, gerr := r.c.GetLoadBalancer(ctx, r.cfg.Project, w.ID)
		if gerr != nil {
			// Not ours: the clusterIP is still held by the load balancer of
			// a Service that is going away; retry with backoff.
			return fmt.Errorf("create load balancer %s: %w (lookup: %v)", w.ID, err, gerr)
		}
		cur = printOf(got)
	}
	want := w.print()
	if cur.vip != want.vip {
		// A VIP never changes; the clusterIP did (cannot happen to a live
		// Service, but a stale cache may say so): start again.
		if err := r.remove(ctx, key, w.ID); err != nil {
			return err
		}
		return r.ensureLB(ctx, key, uid, w)
	}
	var lb *controllerapi.LoadBalancer
	var err error
	switch {
	case cur == want:
		r.store(key, uid, cur)
		return nil
	case cur.spec == want.spec:
		lb, err = r.c.SetMembers(ctx, r.cfg.Project, w.ID, w.Members)
	default:
		u := controllerapi.LoadBalancerUpdate{Name: &w.Name, Listeners: &w.Listeners, Members: &w.Members, Policy: &w.Policy}
		if w.Persistence != nil {
			u.SessionPersistence = w.Persistence
		} else {
			// Clearing what is not there is a no-op for the controller.
			u.ClearSessionPersistence = true
		}
		if u.Members != nil && *u.Members == nil {
			empty := []controllerapi.Member{}
			u.Members = &empty
		}
		lb, err = r.c.UpdateLoadBalancer(ctx, r.cfg.Project, w.ID, u)
	}
	if errors.Is(err, kerrors.NotFound) {
		// Deleted behind our back: forget it and create it again.
		r.mu.Lock()
		delete(r.lbs, key)
		r.mu.Unlock()
		return r.ensureLB(ctx, key, uid, w)
	}
	if err != nil {
		return fmt.Errorf("update load balancer %s: %w", w.ID, err)
	}
	r.store(key, uid, printOf(lb))
	r.log.Debug("services: updated", "service", key, "id", lb.ID, "members", len(lb.Members))
	return nil
}

// dropFIP releases the floating IP with this id if one is known.
func (r *Reconciler) dropFIP(ctx context.Context, id string) error {
	r.mu.Lock()
	_, ok := r.fips[id]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return r.deleteFIP(ctx, id)
}

// deleteFIP releases floating IP id (a missing one is fine) and wakes the
// Services waiting for its address.
func (r *Reconciler) deleteFIP(ctx context.Context, id string) error {
	if err := r.c.DeleteFloatingIP(ctx, r.cfg.Project, id); err != nil && !errors.Is(err, kerrors.NotFound) {
		return fmt.Errorf("delete floating ip %s: %w", id, err)
	}
	r.mu.Lock()
	var wake map[string]bool
	if f := r.fips[id]; f != nil {
		wake = r.waitIP[f.FloatingIPAddress]
		delete(r.waitIP, f.FloatingIPAddress)
	}
	delete(r.fips, id)
	r.mu.Unlock()
	for k := range wake {
		r.q.Add(k)
	}
	return nil
}

// ensureFIP gives a LoadBalancer Service its floating IP, associated with
// its load balancer, and reports it in the Service's status.
func (r *Reconciler) ensureFIP(ctx context.Context, key string, svc *corev1.Service, id string) error {
	r.mu.Lock()
	extOK, cur := r.extOK, r.fips[id]
	warned := r.warned[svc.UID]
	if !extOK {
		r.warned[svc.UID] = true
	}
	r.mu.Unlock()
	if !extOK {
		msg := fmt.Sprintf("external network %q does not exist: no floating IP until it is created", r.cfg.ExternalNetwork)
		if !warned {
			r.rec.Event(svc, corev1.EventTypeWarning, ReasonNoExternal, msg)
		}
		return r.setStatus(ctx, svc, "", metav1.ConditionFalse, ReasonNoExternal, msg)
	}
	req := svc.Spec.LoadBalancerIP
	if cur != nil && req != "" && cur.FloatingIPAddress != req {
		// loadBalancerIP changed: give the old address back first.
		if err := r.dropFIP(ctx, id); err != nil {
			return err
		}
		cur = nil
	}
	if cur == nil {
		f, err := r.c.CreateFloatingIP(ctx, r.cfg.Project, controllerapi.FloatingIP{
			ID: id, FloatingNetworkID: r.cfg.ExternalNetwork, FloatingIPAddress: req, LoadBalancerID: id,
			Description: Description + " " + key,
		})
		switch {
		case err == nil:
			cur = f
			r.log.Info("services: floating ip allocated", "service", key, "ip", f.FloatingIPAddress)
		case errors.Is(err, kerrors.Conflict):
			got, gerr := r.c.GetFloatingIP(ctx, r.cfg.Project, id)
			if gerr == nil {
				cur = got // ours from before a restart
				break
			}
			if req == "" {
				return fmt.Errorf("create floating ip %s: %w", id, err)
			}
			msg := fmt.Sprintf("loadBalancerIP %s is not available: %v", req, err)
			r.rec.Event(svc, corev1.EventTypeWarning, ReasonAddressTaken, msg)
			r.mu.Lock()
			if r.waitIP[req] == nil {
				r.waitIP[req] = map[string]bool{}
			}
			r.waitIP[req][key] = true
			r.mu.Unlock()
			// Released by one of ours: woken at once; by anyone else:
			// seen at the next try.
			r.q.AddAfter(key, retryTakenAddressIn)
			return r.setStatus(ctx, svc, "", metav1.ConditionFalse, ReasonAddressTaken, msg)
		case errors.Is(err, kerrors.Invalid) && req != "":
			msg := fmt.Sprintf("loadBalancerIP %s cannot be used: %v", req, err)
			r.rec.Event(svc, corev1.EventTypeWarning, ReasonAddressInvalid, msg)
			return r.setStatus(ctx, svc, "", metav1.ConditionFalse, ReasonAddressInvalid, msg)
		case errors.Is(err, kerrors.NotFound):
			// The external network went away: say so, look again at resync.
			r.mu.Lock()
			r.extOK = false
			r.mu.Unlock()
			return r.ensureFIP(ctx, key, svc, id)
		case errors.Is(err, kerrors.Exhausted):
			msg := fmt.Sprintf("external network %q has no free address", r.cfg.ExternalNetwork)
			r.rec.Event(svc, corev1.EventTypeWarning, "ExternalNetworkExhausted", msg)
			r.q.AddAfter(key, retryTakenAddressIn)
			return r.setStatus(ctx, svc, "", metav1.ConditionFalse, "ExternalNetworkExhausted", msg)
		default:
			return fmt.Errorf("create floating ip %s: %w", id, err)
		}
	}
	if cur.LoadBalancerID != id {
		f, err := r.c.AssociateFloatingIP(ctx, r.cfg.Project, id, controllerapi.FloatingIPAssociation{LoadBalancerID: id})
		if err != nil {
			return fmt.Errorf("associate floating ip %s: %w", id, err)
		}
		cur = f
	}
	r.mu.Lock()
	r.fips[id] = cur
	r.mu.Unlock()
	r.forgetWaits(key, svc.UID)
	return r.setStatus(ctx, svc, cur.FloatingIPAddress, metav1.ConditionTrue, ReasonAllocated,
		"floating IP "+cur.FloatingIPAddress+" from external network "+r.cfg.ExternalNetwork)
}

// forgetWaits drops what the Service key (uid) waited for: a taken
// address, the warning about the missing external network. Without it
// the caches would keep every Service that ever waited.
func (r *Reconciler) forgetWaits(key string, uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if uid != "" {
		delete(r.warned, uid)
	}
	for addr, keys := range r.waitIP { // only the Services waiting now
		delete(keys, key)
		if len(keys) == 0 {
			delete(r.waitIP, addr)
		}
	}
}

// Waiting reports how many addresses Services wait for and how many
// Services were told that the external network is missing (for tests and
// metrics: both go back to 0 when those Services are gone).
func (r *Reconciler) Waiting() (addresses, warned int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waitIP), len(r.warned)
}

// setStatus writes status.loadBalancer.ingress (ip, or none when empty)
// and the floating IP condition, when they differ from what is there.
func (r *Reconciler) setStatus(ctx context.Context, svc *corev1.Service, ip string, st metav1.ConditionStatus, reason, msg string) error {
	s := svc.DeepCopy()
	var ingress []corev1.LoadBalancerIngress
	if ip != "" {
		vip := corev1.LoadBalancerIPModeVIP
		ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: &vip}}
	}
	s.Status.LoadBalancer.Ingress = ingress
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{
		Type: ConditionFloatingIP, Status: st, Reason: reason, Message: msg, ObservedGeneration: svc.Generation,
	})
	if equality.Semantic.DeepEqual(s.Status, svc.Status) {
		return nil
	}
	if err := r.patchStatus(ctx, svc, ingress, meta.FindStatusCondition(s.Status.Conditions, ConditionFloatingIP)); err != nil {
		return fmt.Errorf("update status of %s/%s: %w", s.Namespace, s.Name, err)
	}
	return nil
}

// patchStatus sets the Service's load balancer ingress and our condition
// (cond nil: removes it) with a strategic merge patch of the status: the
// conditions merge by type, so the patch touches only what is ours and
// needs no resourceVersion precondition (a condition written by someone
// else stays, and a cache a moment behind the API server does not make
// the patch conflict). A patch, not an update: the cached object lacks
// the fields the transform dropped. The ingress list is ours as the
// Service's load balancer implementation.
func (r *Reconciler) patchStatus(ctx context.Context, svc *corev1.Service, ingress []corev1.LoadBalancerIngress, cond *metav1.Condition) error {
	var in any // JSON null removes the field
	if len(ingress) > 0 {
		in = ingress
	}
	c := any(map[string]string{"type": ConditionFloatingIP, "$patch": "delete"})
	if cond != nil {
		c = cond
	}
	b, err := json.Marshal(map[string]any{
		"status": map[string]any{"loadBalancer": map[string]any{"ingress": in}, "conditions": []any{c}},
	})
	if err != nil {
		return err
	}
	_, err = r.kube.CoreV1().Services(svc.Namespace).Patch(ctx, svc.Name, types.StrategicMergePatchType, b,
		metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// clearStatus removes what setStatus wrote, on a Service of our class
// that no longer wants a floating IP.
func (r *Reconciler) clearStatus(ctx context.Context, svc *corev1.Service) error {
	if !r.ours(svc) || (len(svc.Status.LoadBalancer.Ingress) == 0 && meta.FindStatusCondition(svc.Status.Conditions, ConditionFloatingIP) == nil) {
		return nil
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer && clusterIP(svc, r.ranges()).IsValid() {
		return nil
	}
	if err := r.patchStatus(ctx, svc, nil, nil); err != nil {
		return fmt.Errorf("clear status of %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return nil
}

// resync lists what the controller holds, deletes the load balancers and
// floating IPs no Service wants any more, refills the caches and enqueues
// every Service.
func (r *Reconciler) resync(ctx context.Context) error {
	start := time.Now()
	if err := r.checkExternal(ctx); err != nil {
		r.log.Warn("services: resync: external network lookup failed", "err", err)
	}
	// Streamed: only the print of each of ours is kept, never the listing.
	listed := map[string]lbPrint{} // id -> print
	err := r.c.EachLoadBalancer(ctx, r.cfg.Project, func(lb *controllerapi.LoadBalancer) error {
		if strings.HasPrefix(lb.ID, LBPrefix) {
			listed[lb.ID] = printOf(lb)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("resync: list load balancers: %w", err)
	}
	fips, err := r.c.ListFloatingIPs(ctx, r.cfg.Project)
	if err != nil {
		return fmt.Errorf("resync: list floating ips: %w", err)
	}
	if err := r.staleCIDRSubnets(ctx); err != nil {
		// Not fatal: an orphan subnet costs addresses, not traffic.
		r.log.Warn("services: resync: subnets of deleted ServiceCIDRs", "err", err)
	}
	// Read the Services after the controller lists: a load balancer made
	// for a Service implies the Service was in the cache before.
	objs := r.svcIdx.List()
	keys := make([]string, 0, len(objs))
	wantLB := map[string]string{} // id -> key
	wantFIP := map[string]bool{}
	for _, o := range objs {
		so, ok := o.(*svcObj)
		if !ok {
			continue
		}
		keys = append(keys, so.key())
		if s := so.service(); clusterIP(s, r.ranges()).IsValid() {
			wantLB[LBID(s.UID)] = s.Namespace + "/" + s.Name
			if r.wantsFIP(s) {
				wantFIP[LBID(s.UID)] = true
			}
		}
	}
	var stale int
	newLBs := make(map[string]lbEntry, len(listed))
	for id, p := range listed {
		key, ok := wantLB[id]
		if !ok {
			if err := r.remove(ctx, "", id); err != nil {
				return fmt.Errorf("resync: %w", err)
			}
			stale++
			continue
		}
		newLBs[key] = lbEntry{uid: types.UID(id[len(LBPrefix):]), lbPrint: p}
	}
	newFIPs := map[string]*controllerapi.FloatingIP{}
	for i := range fips {
		f := &fips[i]
		if !strings.HasPrefix(f.ID, LBPrefix) {
			continue
		}
		if !wantFIP[f.ID] {
			if err := r.deleteFIP(ctx, f.ID); err != nil {
				return fmt.Errorf("resync: %w", err)
			}
			stale++
			continue
		}
		newFIPs[f.ID] = f
	}
	// Counted before the maps go to the workers, which write them.
	nLBs, nFIPs := len(newLBs), len(newFIPs)
	r.mu.Lock()
	r.lbs, r.fips = newLBs, newFIPs
	r.mu.Unlock()
	for _, k := range keys {
		r.q.Add(k)
	}
	r.log.Info("services: resync", "services", len(keys), "load_balancers", nLBs, "floating_ips", nFIPs,
		"stale_deleted", stale, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
