package services

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"

	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// The clusterIP ranges served: the API server's --service-cluster-ip-range
// (Config.ServiceCIDR, whose service subnet setup makes) and the IPv4
// ranges of the cluster's networking.k8s.io/v1 ServiceCIDR objects, with
// which an administrator grows the Service range (GA since v1.33; the API
// server then hands out clusterIPs from any ready ServiceCIDR). A range
// that the configured one does not cover gets a service subnet of its own
// (cidrSubnetID), made before any Service in it is synced: at setup for
// the objects that exist, through a queued key for later ones. The API
// server keeps a ServiceCIDR (a finalizer) until no clusterIP is left in
// it, so its subnet is deleted once the object is gone, by its key or by
// the resync after a restart.

// addrRange is what clusterIP checks a clusterIP against: a netip.Prefix
// or a rangeSet.
type addrRange interface{ Contains(netip.Addr) bool }

// svcRange is one clusterIP range and the service subnet of its VIPs.
type svcRange struct {
	pfx    netip.Prefix
	subnet string
}

// rangeSet is the configured range first, then the added ranges; a
// published rangeSet is never modified.
type rangeSet []svcRange

// Contains reports whether a is in one of the ranges.
func (s rangeSet) Contains(a netip.Addr) bool {
	for _, r := range s {
		if r.pfx.Contains(a) {
			return true
		}
	}
	return false
}

// subnetOf is the service subnet of the range holding the address vip,
// else def.
func (s rangeSet) subnetOf(vip, def string) string {
	a, err := netip.ParseAddr(vip)
	if err != nil {
		return def
	}
	for _, r := range s {
		if r.pfx.Contains(a) {
			return r.subnet
		}
	}
	return def
}

const (
	// cidrSubnetPrefix starts the id of an added range's service subnet.
	cidrSubnetPrefix = "k8s-servicecidr-"
	// cidrKeyPrefix starts the queue key of a ServiceCIDR (then its name).
	cidrKeyPrefix = "\x00cidr/"
)

// cidrSubnetID is the service subnet id of the ServiceCIDR name: the name
// itself when it fits the controller's 128 characters, else a hash of it.
func cidrSubnetID(name string) string {
	if len(cidrSubnetPrefix)+len(name) <= 128 {
		return cidrSubnetPrefix + name
	}
	h := sha256.Sum256([]byte(name))
	return cidrSubnetPrefix + hex.EncodeToString(h[:16])
}

// ranges is the current rangeSet.
func (r *Reconciler) ranges() rangeSet {
	if p := r.rangesPtr.Load(); p != nil {
		return *p
	}
	return rangeSet{{pfx: r.cfg.ServiceCIDR, subnet: r.cfg.ServiceSubnet}}
}

// publishRanges rebuilds the rangeSet from r.added; r.mu must be held.
func (r *Reconciler) publishRanges() {
	s := rangeSet{{pfx: r.cfg.ServiceCIDR, subnet: r.cfg.ServiceSubnet}}
	for _, rg := range r.added {
		s = append(s, rg)
	}
	r.rangesPtr.Store(&s)
}

// cidrOf returns the IPv4 range of a ServiceCIDR that needs a subnet of
// its own: none (ok false) when it has no IPv4 range or the configured
// range covers it (the default "kubernetes" ServiceCIDR mirrors it).
func (r *Reconciler) cidrOf(sc *networkingv1.ServiceCIDR) (netip.Prefix, bool) {
	for _, c := range sc.Spec.CIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		if r.cfg.ServiceCIDR.Contains(p.Addr()) && r.cfg.ServiceCIDR.Bits() <= p.Bits() {
			return netip.Prefix{}, false
		}
		return p, true
	}
	return netip.Prefix{}, false
}

// syncCIDRs makes the subnets of every ServiceCIDR known to the informer
// (setup: before the first resync, so that no load balancer of an added
// range is taken for stale). A range that fails is logged and queued for
// a retry: it must not hold the Services of the other ranges back.
func (r *Reconciler) syncCIDRs(ctx context.Context) {
	if r.cidrInf == nil {
		return
	}
	for _, k := range r.cidrInf.GetStore().ListKeys() {
		// No Service is enqueued: the first resync, next, enqueues all.
		if _, err := r.serveCIDR(ctx, k); err != nil {
			r.log.Warn("services: ServiceCIDR not served yet", "name", k, "err", err)
			r.q.Add(cidrKeyPrefix + k)
		}
	}
}

// syncCIDR serves the ServiceCIDR name as it is now (serveCIDR) and, when
// a range appeared, syncs every Service again: those in it get their load
// balancers.
func (r *Reconciler) syncCIDR(ctx context.Context, name string) error {
	added, err := r.serveCIDR(ctx, name)
	if added {
		for _, k := range r.svcIdx.ListKeys() {
			r.enqueue(k)
		}
	}
	return err
}

// serveCIDR makes the service subnet of the ServiceCIDR name, or deletes
// it when the object is gone, and publishes the ranges; added says that a
// range is served now that was not.
func (r *Reconciler) serveCIDR(ctx context.Context, name string) (added bool, err error) {
	var sc *networkingv1.ServiceCIDR
	if r.cidrInf != nil {
		if o, ok, err := r.cidrInf.GetStore().GetByKey(name); err == nil && ok {
			sc, _ = o.(*networkingv1.ServiceCIDR)
		}
	}
	id := cidrSubnetID(name)
	if sc == nil {
		r.mu.Lock()
		_, had := r.added[name]
		delete(r.added, name)
		r.publishRanges()
		r.mu.Unlock()
		if had {
			// The API server removes the object only once no clusterIP
			// is left in it; the resync deletes any load balancer still
			// there.
			r.enqueue(resyncKey)
		}
		// Also when not served now: a retry after a failed delete, or
		// a range that was never served (NotFound then).
		return false, r.deleteCIDRSubnet(ctx, id)
	}
	pfx, ok := r.cidrOf(sc)
	if !ok {
		return false, nil
	}
	r.mu.Lock()
	cur, had := r.added[name]
	r.mu.Unlock()
	if had && cur.pfx == pfx {
		return false, nil
	}
	if err := r.ensureSubnet(ctx, id, pfx); err != nil {
		return false, err
	}
	r.mu.Lock()
	r.added[name] = svcRange{pfx: pfx, subnet: id}
	r.publishRanges()
	r.mu.Unlock()
	r.log.Info("services: serving a ServiceCIDR", "name", name, "cidr", pfx, "subnet", id)
	return true, nil
}

// deleteCIDRSubnet deletes an added range's subnet; one that still holds
// load balancers is retried (their Services' syncs delete them).
func (r *Reconciler) deleteCIDRSubnet(ctx context.Context, id string) error {
	err := r.c.DeleteSubnet(ctx, r.cfg.Project, id)
	if err == nil {
		r.log.Info("services: deleted the subnet of a ServiceCIDR that is gone", "subnet", id)
	}
	if err == nil || errors.Is(err, kerrors.NotFound) {
		return nil
	}
	return fmt.Errorf("delete service subnet %s: %w", id, err)
}

// staleCIDRSubnets deletes the added ranges' subnets whose ServiceCIDR is
// gone (deleted while no watcher led); part of the resync.
func (r *Reconciler) staleCIDRSubnets(ctx context.Context) error {
	if r.cidrInf == nil {
		return nil
	}
	sns, err := r.c.ListSubnets(ctx, r.cfg.Project, r.cfg.VPC)
	if err != nil {
		return fmt.Errorf("list subnets: %w", err)
	}
	want := map[string]bool{}
	for _, k := range r.cidrInf.GetStore().ListKeys() {
		want[cidrSubnetID(k)] = true
	}
	var errs []error
	for _, sn := range sns {
		if sn.Purpose != controllerapi.SubnetPurposeService || !strings.HasPrefix(sn.ID, cidrSubnetPrefix) || want[sn.ID] {
			continue
		}
		if err := r.deleteCIDRSubnet(ctx, sn.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
