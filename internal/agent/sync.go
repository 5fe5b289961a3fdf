package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// maxReason bounds the status_reason the agent sends.
const maxReason = 400

// syncPort makes one port's datapath state match the cache: plugged and
// reported UP when it is bound here, unplugged otherwise. An urgent sync
// (a CNI ADD waits on it) in Kubernetes mode plugs only: the status report,
// a round trip to the controller, follows in a plain sync of the same key
// (so that the two never cross), which does not plug again.
func (a *Agent) syncPort(ctx context.Context, id string, urgent bool) (retErr error) {
	p, ok := a.cachedPort(id)
	if !ok && !a.isSynced() {
		// Not listed yet: absence means nothing. The first list ends with
		// a full resync that comes back here.
		return nil
	}
	// Callers of Attach/Detach learn the outcome; a port that is not (or
	// no longer) here tells only a Detach (an Attach waits for it).
	var res *plugResult
	defer func() {
		if res != nil {
			if res.err == nil && retErr != nil {
				res.err = retErr
			}
			a.notify(id, *res)
		}
	}()
	a.mu.Lock()
	plugged, justPlugged := a.unreported[id]
	delete(a.unreported, id)
	a.mu.Unlock()
	if !ok || !a.isLocal(&p) || a.unattached(&p) {
		err := a.dp.Unplug(ctx, id)
		if errors.Is(err, kerrors.Conflict) || errors.Is(err, kerrors.Invalid) {
			a.log.Warn("not unplugging a link we do not own", "port", id, "err", err)
			err = nil
		}
		if err == nil && ok && !a.isLocal(&p) {
			a.log.Debug("unplugged port moved away", "port", id)
		}
		if err == nil && ok && a.isLocal(&p) {
			// Unplugged: a waiting Detach returns now, before the
			// status report's round trip to the controller.
			a.notify(id, plugResult{})
			if p.VNI != 0 && p.Status != controllerapi.StatusPending {
				// It may have been the VPC's last port here. A PENDING
				// port was never plugged: a burst of new pods' ports,
				// waiting for their ADDs, queues no VPC sync, whose
				// exclusive lock would hold up the plugs.
				a.q.Add(vpcKey(p.VNI))
			}
			if p.Status != controllerapi.StatusPending {
				err = a.report(ctx, &p, controllerapi.StatusDown, "not attached to a pod")
			}
		} else if !ok {
			a.notifyDetached(id, err)
		}
		return err
	}
	spec, err := a.portSpec(ctx, &p)
	if err != nil {
		if errors.Is(err, kerrors.Invalid) {
			res = &plugResult{err: err}
			return a.report(ctx, &p, controllerapi.StatusError, err.Error())
		}
		return err
	}
	if gone, reason := netnsGone(spec.NetNS); gone {
		res = &plugResult{err: kerrors.New(kerrors.NotFound, "%s", reason)}
		if err := a.dp.Unplug(ctx, id); err != nil && !errors.Is(err, kerrors.Conflict) {
			return err
		}
		a.q.Add(vpcKey(spec.VNI)) // it may have been the VPC's last port here
		return a.report(ctx, &p, controllerapi.StatusDown, reason)
	}
	if justPlugged && plugged == spec.NetNS {
		return a.reportPlugged(ctx, &p, spec)
	}
	// Ensuring the VPC takes its lock exclusively; plugging shares it, so
	// ports of one VPC plug in parallel but never while the VPC is being
	// changed or removed.
	l := a.vpcLock(spec.VNI)
	err = nil
	if !a.vpcHas(spec) {
		l.Lock()
		err = a.ensureVPC(ctx, spec.VNI, spec)
		l.Unlock()
	}
	if err == nil {
		l.RLock()
		start := time.Now()
		err = a.dp.Plug(ctx, spec)
		a.m.observePlug(start, err)
		l.RUnlock()
	}
	if err != nil {
		a.forgetVPC(spec.VNI) // ensure it in full next time
		res = &plugResult{err: err}
		if gone, reason := netnsGone(spec.NetNS); gone {
			return a.report(ctx, &p, controllerapi.StatusDown, reason)
		}
		if rerr := a.report(ctx, &p, controllerapi.StatusError, err.Error()); rerr != nil {
			a.log.Warn("report port error", "port", id, "err", rerr)
		}
		if errors.Is(err, kerrors.Invalid) {
			return nil // retrying cannot help; the next resync tries again
		}
		return err
	}
	a.mu.Lock()
	needRemotes := !a.ready[spec.VNI]
	delete(a.empty, spec.VNI) // in use again: a later empty spell lingers in full
	a.mu.Unlock()
	if needRemotes {
		a.q.Add(vpcKey(spec.VNI))
	}
	// Plugged: a waiting Attach returns now; the UP report to the
	// controller follows (a failed report is retried by the queue).
	a.notify(id, plugResult{plugged: true})
	if urgent && a.cfg.LocalAttach {
		// Free this worker for the next ADD: a plain sync reports.
		a.mu.Lock()
		a.unreported[id] = spec.NetNS
		a.mu.Unlock()
		a.q.Add(portKey(id))
		return nil
	}
	return a.reportPlugged(ctx, &p, spec)
}

// reportPlugged tells the controller a plugged port's status.
func (a *Agent) reportPlugged(ctx context.Context, p *controllerapi.Port, spec datapath.PortSpec) error {
	if spec.AdminDown {
		return a.report(ctx, p, controllerapi.StatusDown, "admin_state_up is false")
	}
	return a.report(ctx, p, controllerapi.StatusUp, "")
}

// netnsGone reports whether a namespace path no longer exists.
func netnsGone(path string) (bool, string) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return true, fmt.Sprintf("network namespace %s does not exist", path)
	}
	return false, ""
}

// ensureVPC creates or repairs the VPC with the gateways of every local
// port in it (plus extra's) and of the subnets of its remote ports: a
// local pod reaches a pod of another subnet that has no port on this host
// only when that subnet is on-link here (routed between the bridge's
// gateways, then bridged to the VXLAN device). The caller holds the VPC's
// lock: exclusively, or shared in programVPC (one sync of a VPC at a time).
func (a *Agent) ensureVPC(ctx context.Context, vni uint32, extra ...datapath.PortSpec) error {
	specs := append(a.localSpecs(vni), extra...)
	gws := gatewaysOf(append(specs, a.remoteGatewaySpecs(vni)...))
	if err := a.dp.EnsureVPC(ctx, datapath.VPCSpec{VNI: vni, Gateways: gws}); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	set := map[string]bool{}
	for _, g := range gws {
		set[g.String()] = true
	}
	a.gateways[vni] = set
	return nil
}

// vpcHas reports whether the VPC of spec was ensured with every gateway
// the port needs, so plugging it may skip EnsureVPC (a stale answer only
// costs a failed Plug, which forgets the VPC and retries).
func (a *Agent) vpcHas(spec datapath.PortSpec) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	set := a.gateways[spec.VNI]
	if set == nil {
		return false
	}
	for _, g := range gatewaysOf([]datapath.PortSpec{spec}) {
		if !set[g.String()] {
			return false
		}
	}
	return true
}

func (a *Agent) forgetVPC(vni uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.gateways, vni)
}

// syncVPC programs a VPC's remote ports, or removes the VPC when no local
// port uses it any more.
func (a *Agent) syncVPC(ctx context.Context, vni uint32) error {
	l := a.vpcLock(vni)
	// A VPC that keeps local ports is programmed under the shared lock:
	// its gateways and remotes are nothing a plug touches, and under a
	// burst of pods an exclusive lock here stalls every plug behind the
	// ones in flight. Only the removal of a VPC is exclusive.
	l.RLock()
	done, err := a.programVPC(ctx, vni)
	l.RUnlock()
	if done {
		return err
	}
	l.Lock()
	defer l.Unlock()
	// Looked at again under the exclusive lock: a local port may have
	// come meanwhile. Only local ports that can be plugged keep a VPC
	// here: one whose ports are all invalid or lost their namespace is
	// removed.
	if done, err := a.programVPC(ctx, vni); done {
		return err
	}
	if wait := a.lingerLeft(vni); wait > 0 {
		// Keep the VPC a while for the next pod; look again then.
		// Remote changes are not programmed meanwhile, so the next
		// plug must queue a full VPC sync.
		a.mu.Lock()
		delete(a.ready, vni)
		a.mu.Unlock()
		a.q.AddAfter(vpcKey(vni), wait)
		return nil
	}
	a.mu.Lock()
	delete(a.ready, vni)
	delete(a.gateways, vni)
	delete(a.empty, vni)
	a.mu.Unlock()
	return a.dp.DeleteVPC(ctx, vni)
}

// programVPC ensures a VPC that has local ports and programs its remote
// ports (done true); with no local port it does nothing (done false). The
// caller holds the VPC's lock, shared at least: only one sync of a VPC
// runs at a time (one queue key), and a plug that ensures the VPC takes
// the lock exclusively.
func (a *Agent) programVPC(ctx context.Context, vni uint32) (done bool, err error) {
	nlocal := 0
	for _, s := range a.localSpecs(vni) {
		if gone, _ := netnsGone(s.NetNS); !gone {
			nlocal++
		}
	}
	if nlocal == 0 {
		return false, nil
	}
	a.mu.Lock()
	var remotes []datapath.Remote
	for _, p := range a.ports {
		if p.VNI != vni || a.isLocal(p) {
			continue
		}
		if r, ok := toRemote(p, a.hosts[p.BindingHostID]); ok {
			remotes = append(remotes, r)
		}
	}
	delete(a.empty, vni)
	a.mu.Unlock()
	if err := a.ensureVPC(ctx, vni); err != nil {
		a.forgetVPC(vni)
		return true, err
	}
	if err := a.dp.SetRemotes(ctx, vni, remotes); err != nil {
		return true, err
	}
	a.mu.Lock()
	a.ready[vni] = true
	a.mu.Unlock()
	return true, nil
}

// lingerLeft says how much longer an empty VPC is kept: it starts the
// clock the first time the VPC is found empty. A VPC the agent never
// programmed itself (an orphan found by a resync, or one left by an
// earlier run) is not kept.
func (a *Agent) lingerLeft(vni uint32) time.Duration {
	if a.cfg.VPCLinger <= 0 {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gateways[vni] == nil && a.empty[vni].IsZero() {
		return 0
	}
	since, ok := a.empty[vni]
	if !ok {
		since = time.Now()
		a.empty[vni] = since
	}
	return a.cfg.VPCLinger - time.Since(since)
}

// remoteGatewaySpecs gives, for each remote port of a VPC, a spec holding
// only its addresses (with their subnets' gateways), for gatewaysOf.
// Addresses the cache cannot describe are skipped.
func (a *Agent) remoteGatewaySpecs(vni uint32) []datapath.PortSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []datapath.PortSpec
	for _, p := range a.ports {
		if p.VNI != vni || a.isLocal(p) {
			continue
		}
		cp := a.withSubnetsLocked(p)
		var s datapath.PortSpec
		for _, f := range cp.FixedIPs {
			if pa, err := toPortAddr(p.ID, f); err == nil {
				s.Addrs = append(s.Addrs, pa)
			}
		}
		out = append(out, s)
	}
	return out
}

// localSpecs converts the cached local ports of a VPC, skipping those
// that cannot be converted from the cache alone.
func (a *Agent) localSpecs(vni uint32) []datapath.PortSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []datapath.PortSpec
	for _, p := range a.ports {
		if p.VNI != vni || !a.isLocal(p) {
			continue
		}
		cp := a.withSubnetsLocked(p)
		if s, err := toPortSpec(&cp); err == nil {
			out = append(out, s)
		}
	}
	return out
}

func (a *Agent) cachedPort(id string) (controllerapi.Port, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.ports[id]
	if p == nil {
		return controllerapi.Port{}, false
	}
	return *p, true
}

// withSubnetsLocked returns a copy of p whose fixed IPs have their cidr and
// gateway filled from the subnet cache where the controller left them out.
func (a *Agent) withSubnetsLocked(p *controllerapi.Port) controllerapi.Port {
	cp := *p
	cp.FixedIPs = append([]controllerapi.FixedIP(nil), p.FixedIPs...)
	for i, f := range cp.FixedIPs {
		if s := a.subnets[f.SubnetID]; f.CIDR == "" && s != nil {
			cp.FixedIPs[i].CIDR, cp.FixedIPs[i].GatewayIP = s.CIDR, s.GatewayIP
		}
	}
	return cp
}

// portSpec converts a port, fetching subnets its fixed IPs do not
// describe.
func (a *Agent) portSpec(ctx context.Context, p *controllerapi.Port) (datapath.PortSpec, error) {
	for _, f := range p.FixedIPs {
		a.mu.Lock()
		known := f.CIDR != "" || a.subnets[f.SubnetID] != nil
		a.mu.Unlock()
		if known || f.SubnetID == "" {
			continue
		}
		s, err := a.c.GetSubnet(ctx, p.ProjectID, f.SubnetID)
		if err != nil {
			if errors.Is(err, kerrors.NotFound) {
				return datapath.PortSpec{}, kerrors.New(kerrors.Invalid, "port %s: subnet %s: %v", p.ID, f.SubnetID, err)
			}
			return datapath.PortSpec{}, fmt.Errorf("port %s: %w", p.ID, err)
		}
		a.mu.Lock()
		a.subnets[f.SubnetID] = s
		a.mu.Unlock()
	}
	a.mu.Lock()
	cp := a.withSubnetsLocked(p)
	a.mu.Unlock()
	return toPortSpec(&cp)
}

// report tells the controller a port's status unless it already has it,
// and stores the controller's answer in the cache (without queueing).
func (a *Agent) report(ctx context.Context, p *controllerapi.Port, status, reason string) error {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	if p.Status == status && p.StatusReason == reason {
		return nil
	}
	np, err := a.c.SetPortStatus(ctx, p.ProjectID, p.ID, status, reason)
	if errors.Is(err, kerrors.NotFound) {
		return nil // deleted meanwhile; its DELETED event follows
	}
	if err != nil {
		return fmt.Errorf("report port %s %s: %w", p.ID, status, err)
	}
	if status != controllerapi.StatusUp {
		a.log.Info("port status", "port", p.ID, "status", status, "reason", reason)
	}
	var refused error
	a.mu.Lock()
	if old := a.ports[np.ID]; old != nil && old.RevisionNumber <= np.RevisionNumber {
		cp := *np
		refused = a.withAttachmentLocked(&cp)
		a.ports[np.ID] = &cp
	}
	a.mu.Unlock()
	if refused != nil {
		a.notify(np.ID, plugResult{err: refused})
	}
	return nil
}

// syncGuards sets the anti-spoofing guards of every local port with port
// security (the datapath keeps them in one table, rewritten whole).
// Datapaths without guards skip it.
func (a *Agent) syncGuards(ctx context.Context) error {
	gs, ok := a.dp.(guardSetter)
	if !ok || !a.isSynced() {
		return nil // before the first list the cache would drop guards
	}
	a.mu.Lock()
	var guards []datapath.Guard
	for _, p := range a.ports {
		if !a.isLocal(p) {
			continue
		}
		if g, ok := toGuard(p); ok {
			guards = append(guards, g)
		}
	}
	a.mu.Unlock()
	return gs.SetGuards(ctx, guards)
}
