package services

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// setup is the leader's first step (internal/kube/ctrl retries it while
// the controller is unavailable): it waits for the cluster's VPC
// (internal/kube/podports makes it), makes sure the service subnet exists,
// looks up the external network, then runs the first resync, before the
// workers start, so that the caches hold what the controller has: a
// restart then sends no write for a Service whose load balancer is
// already right.
func (r *Reconciler) setup(ctx context.Context) error {
	if err := r.trySetup(ctx); err != nil {
		return err
	}
	if err := r.resync(ctx); err != nil {
		// Not permanent whatever its kind: the first resync is retried.
		return fmt.Errorf("services: initial resync: %s", err)
	}
	return nil
}

func (r *Reconciler) trySetup(ctx context.Context) error {
	vpc, err := r.c.GetVPC(ctx, r.cfg.Project, r.cfg.VPC)
	if err != nil {
		return fmt.Errorf("vpc %s of project %s: %w", r.cfg.VPC, r.cfg.Project, err)
	}
	pfx := netip.MustParsePrefix("0.0.0.0/0")
	if r.cfg.ServiceCIDR.Addr().Is6() {
		pfx = netip.MustParsePrefix("::/0")
	}
	if vpc.CIDR != "" {
		if pfx, err = netip.ParsePrefix(vpc.CIDR); err != nil {
			return fmt.Errorf("vpc %s cidr %q: %w", vpc.ID, vpc.CIDR, err)
		}
	}
	if err := r.ensureSubnet(ctx, r.cfg.ServiceSubnet, r.cfg.ServiceCIDR); err != nil {
		return err
	}
	r.syncCIDRs(ctx)
	if err := r.checkExternal(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	r.vpcPrefix = pfx
	r.mu.Unlock()
	return nil
}

// serviceSubnetPlan returns the CIDR and gateway of the service subnet to
// create for the service range. The controller reserves a gateway in every
// subnet, and Kubernetes hands out the range's first host (10.96.0.1, the
// "kubernetes" Service) like any other address, so the subnet is the
// range's supernet one bit wider, with the gateway on its half outside the
// range: every clusterIP stays requestable. exact asks for the range
// itself instead (when the supernet overlaps another subnet), the gateway
// then being its last host, which a Service could be given (documented).
func serviceSubnetPlan(rng netip.Prefix, exact bool) (cidr netip.Prefix, gw netip.Addr) {
	rng = rng.Masked()
	if exact || rng.Bits() == 0 {
		return rng, lastHost(rng)
	}
	sup := netip.PrefixFrom(rng.Addr(), rng.Bits()-1).Masked()
	first := sup.Addr().Next()
	if !rng.Contains(first) {
		return sup, first
	}
	return sup, lastHost(sup)
}

// lastHost is the highest address of p that is not its IPv4 broadcast.
func lastHost(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	host := p.Addr().BitLen() - p.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	a, _ := netip.AddrFromSlice(b)
	if p.Addr().Is4() {
		a = a.Prev()
	}
	return a
}

// ensureSubnet makes sure the service subnet id covers the clusterIP
// range rng (the configured range, or an added ServiceCIDR's).
func (r *Reconciler) ensureSubnet(ctx context.Context, id string, rng netip.Prefix) error {
	for _, exact := range []bool{false, true} {
		sn, err := r.c.GetSubnet(ctx, r.cfg.Project, id)
		if err == nil {
			return r.checkServiceSubnet(sn, rng)
		}
		if !errors.Is(err, kerrors.NotFound) {
			return fmt.Errorf("service subnet %s: %w", id, err)
		}
		cidr, gw := serviceSubnetPlan(rng, exact)
		sn, err = r.c.CreateSubnet(ctx, r.cfg.Project, controllerapi.Subnet{
			ID: id, Name: id, NetworkID: r.cfg.VPC, CIDR: cidr.String(), GatewayIP: gw.String(),
			Purpose:     controllerapi.SubnetPurposeService,
			Description: "Kubernetes clusterIPs (" + rng.String() + ")",
		})
		switch {
		case err == nil:
			r.log.Info("services: created the service subnet", "id", id, "cidr", cidr, "gateway", gw,
				"service_cidr", rng)
			return nil
		case errors.Is(err, kerrors.Conflict) && strings.Contains(err.Error(), "overlaps") && !exact:
			r.log.Warn("services: the service range's supernet overlaps a subnet; using the range itself "+
				"(its last host is the subnet's gateway and cannot be a load balancer VIP)", "err", err)
		case errors.Is(err, kerrors.Conflict) && strings.Contains(err.Error(), "already exists"):
			// Another replica made it: read it on the next pass.
		default:
			return fmt.Errorf("create service subnet %s (%s): %w", id, cidr, err)
		}
	}
	sn, err := r.c.GetSubnet(ctx, r.cfg.Project, id)
	if err != nil {
		return fmt.Errorf("service subnet %s: %w", id, err)
	}
	return r.checkServiceSubnet(sn, rng)
}

func (r *Reconciler) checkServiceSubnet(sn *controllerapi.Subnet, rng netip.Prefix) error {
	p, err := netip.ParsePrefix(sn.CIDR)
	if err != nil || !p.Contains(rng.Addr()) || p.Bits() > rng.Bits() {
		return kerrors.New(kerrors.Invalid, "service subnet %s (%s) does not cover the service range %s",
			sn.ID, sn.CIDR, rng)
	}
	if sn.NetworkID != r.cfg.VPC {
		return kerrors.New(kerrors.Invalid, "service subnet %s belongs to vpc %s, not %s", sn.ID, sn.NetworkID, r.cfg.VPC)
	}
	return nil
}

// checkExternal looks the external network up. A missing one is not an
// error: pods and ClusterIPs keep working, and the absence is said loudly
// (here, once until the network appears, and as an Event on every
// LoadBalancer Service).
func (r *Reconciler) checkExternal(ctx context.Context) error {
	_, err := r.c.GetExternalNetwork(ctx, r.cfg.ExternalNetwork)
	ok := err == nil
	if err != nil && !errors.Is(err, kerrors.NotFound) {
		return fmt.Errorf("external network %s: %w", r.cfg.ExternalNetwork, err)
	}
	r.mu.Lock()
	was, said := r.extOK, r.extSaid
	r.extOK = ok
	r.extSaid = !ok
	if ok {
		clear(r.warned)
	}
	r.mu.Unlock()
	switch {
	case !ok && !said:
		r.log.Error("services: EXTERNAL NETWORK NOT FOUND: Services of type LoadBalancer get no floating IP "+
			"until it is created (ClusterIPs work)", "external_network", r.cfg.ExternalNetwork)
	case !was:
		r.log.Info("services: external network found", "external_network", r.cfg.ExternalNetwork)
	}
	return nil
}
