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

// syncPort makes one port's datapath state match the cache (queue key
// "p/<id>"): plugged and reported UP when it is bound here and has a
// place (its record's network_ns, or with LocalAttach its attachment),
// unplugged otherwise. An urgent sync (a CNI ADD or DEL waits on it) in
// Kubernetes mode plugs only: the status report, a round trip to the
// controller, follows in a plain sync of the same key (so that the two
// never cross), which does not plug again. In order:
//
//  1. read the port and place it (attach.go);
//  2. not bound here, or nowhere to go: unplug (unplugPort);
//  3. convert it (subnets fetched when needed); its namespace gone: unplug;
//  4. a plain sync of a port plugged as it is now (same spec, same VPC
//     bridge, less than Config.Replug ago): touch nothing, report;
//  5. ensure its VPC unless it has the port's gateways (vpc.go), plug;
//  6. tell the waiting Attach, then report (now, or in the plain sync).
func (a *Agent) syncPort(ctx context.Context, id string, urgent bool) (retErr error) {
	if urgent {
		a.att.plugStarted(id) // Plugging: a CNI ADD waits on this sync
		defer a.att.plugEnded(id)
	}
	p, ok := a.ports.get(id)
	if !ok && !a.ports.isSynced() {
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
			a.att.notify(id, *res)
		}
	}()
	plugged, justPlugged := a.ports.takeUnreported(id)
	if !ok || !a.ports.isLocal(&p) || !a.place(&p) {
		return a.unplugPort(ctx, id, p, ok)
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
		a.ports.unmarkPlugged(id)
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
	mark := a.plugMark(spec)
	if !urgent && a.ports.pluggedAs(id, mark, a.cfg.Replug) {
		// Unchanged since its last plug (a resync, an event that changes
		// nothing here): touch nothing. A CNI ADD (urgent) always plugs.
		a.att.notify(id, plugResult{plugged: true})
		return a.reportPlugged(ctx, &p, spec)
	}

	a.ports.unmarkPlugged(id)
	if err := a.plug(ctx, spec); err != nil {
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
	if a.vpcs.used(spec.VNI) {
		a.q.Add(vpcKey(spec.VNI)) // its remotes
	}

	mark.bridge = a.bridgeOf(spec.VNI) // known now, if the plug ensured the VPC
	a.ports.markPlugged(id, mark)
	// Plugged: a waiting Attach returns now; the UP report to the
	// controller follows (a failed report is retried by the queue).
	a.att.notify(id, plugResult{plugged: true})
	if urgent && a.cfg.LocalAttach {
		// Free this worker for the next ADD: a plain sync reports.
		a.ports.setUnreported(id, spec.NetNS)
		a.q.Add(portKey(id))
		return nil
	}
	return a.reportPlugged(ctx, &p, spec)
}

// unplugPort removes a port that is not (or no longer) plugged here: gone
// from the cache (ok false), bound elsewhere, or waiting for an
// attachment.
func (a *Agent) unplugPort(ctx context.Context, id string, p controllerapi.Port, ok bool) error {
	a.ports.unmarkPlugged(id)
	err := a.dp.Unplug(ctx, id)
	if errors.Is(err, kerrors.Conflict) || errors.Is(err, kerrors.Invalid) {
		a.log.Warn("not unplugging a link we do not own", "port", id, "err", err)
		err = nil
	}
	switch {
	case !ok:
		a.att.notifyDetached(id, err)
		return err
	case err != nil:
		return err
	case !a.ports.isLocal(&p):
		a.log.Debug("unplugged port moved away", "port", id)
		return nil
	}
	// Unplugged: a waiting Detach returns now, before the status report's
	// round trip to the controller.
	a.att.notify(id, plugResult{})
	if p.Status == controllerapi.StatusPending {
		// Never plugged: a burst of new pods' ports, waiting for their
		// ADDs, queues no VPC sync, whose exclusive lock would hold up
		// the plugs.
		return nil
	}
	if p.VNI != 0 {
		a.q.Add(vpcKey(p.VNI)) // it may have been the VPC's last port here
	}
	return a.report(ctx, &p, controllerapi.StatusDown, "not attached to a pod")
}

// plug ensures the port's VPC unless it was ensured with the port's
// gateways, then plugs the port. Ensuring the VPC takes its lock
// exclusively; plugging shares it, so ports of one VPC plug in parallel
// but never while the VPC is being changed or removed. A failure makes
// the next plug ensure the VPC in full.
func (a *Agent) plug(ctx context.Context, spec datapath.PortSpec) error {
	// The VPC's lock is shared, the ensure too: under the exclusive lock
	// an ensure waited for every plug in flight (each waiting for the
	// kernel's RTNL lock in a burst), and every plug after it waited for
	// the ensure, a convoy that stalled the burst's ADDs for seconds. Only
	// the VPC's removal excludes plugs; ensures take turns at the VPC's
	// ensure lock (ensureVPC), not at each other's plugs.
	a.att.plugStarted(spec.ID)
	defer a.att.plugEnded(spec.ID)
	l := a.vpcs.lock(spec.VNI)
	l.RLock()
	var err error
	if !a.vpcs.has(spec.VNI, gatewaysOf([]datapath.PortSpec{spec})) {
		err = a.ensureVPC(ctx, spec.VNI, spec)
	}
	if err == nil {
		start := time.Now()
		err = a.dp.Plug(ctx, spec)
		a.m.observePlug(start, err)
	}
	l.RUnlock()
	if err != nil {
		a.vpcs.forget(spec.VNI)
	}
	return err
}

// plugMark is what a plug of spec now would record (cache.go): the spec
// in a comparable form and the VPC's bridge, as the datapath knows it.
func (a *Agent) plugMark(spec datapath.PortSpec) plugMark {
	return plugMark{print: fmt.Sprintf("%s|%d|%s|%s|%v|%t", spec.NetNS, spec.VNI, spec.IfName, spec.MAC, spec.Addrs, spec.AdminDown),
		bridge: a.bridgeOf(spec.VNI), at: time.Now()}
}

// bridgeOf is the index of the VPC's bridge as the datapath knows it (0
// when it does not say).
func (a *Agent) bridgeOf(vni uint32) int {
	if bi, ok := a.dp.(bridgeIndexer); ok {
		return bi.BridgeIndex(vni)
	}
	return 0
}

// portSpec converts a port, fetching subnets its fixed IPs do not
// describe.
func (a *Agent) portSpec(ctx context.Context, p *controllerapi.Port) (datapath.PortSpec, error) {
	for _, f := range p.FixedIPs {
		if f.CIDR != "" || f.SubnetID == "" || a.ports.hasSubnet(f.SubnetID) {
			continue
		}
		s, err := a.c.GetSubnet(ctx, p.ProjectID, f.SubnetID)
		if err != nil {
			if errors.Is(err, kerrors.NotFound) {
				return datapath.PortSpec{}, kerrors.New(kerrors.Invalid, "port %s: subnet %s: %v", p.ID, f.SubnetID, err)
			}
			return datapath.PortSpec{}, fmt.Errorf("port %s: %w", p.ID, err)
		}
		a.ports.putSubnet(f.SubnetID, s)
	}
	cp := a.ports.withSubnets(p)
	return toPortSpec(&cp)
}

// netnsGone reports whether a namespace path no longer exists.
func netnsGone(path string) (bool, string) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return true, fmt.Sprintf("network namespace %s does not exist", path)
	}
	return false, ""
}

// reportPlugged tells the controller a plugged port's status.
func (a *Agent) reportPlugged(ctx context.Context, p *controllerapi.Port, spec datapath.PortSpec) error {
	if spec.AdminDown {
		return a.report(ctx, p, controllerapi.StatusDown, "admin_state_up is false")
	}
	return a.report(ctx, p, controllerapi.StatusUp, "")
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
	a.ports.storeReport(np)
	return nil
}

// syncGuards sets the anti-spoofing guards of every local port with port
// security (queue key "g/"; the datapath keeps them in one table,
// rewritten whole). Datapaths without guards skip it.
func (a *Agent) syncGuards(ctx context.Context) error {
	gs, ok := a.dp.(guardSetter)
	if !ok || !a.ports.isSynced() {
		return nil // before the first list the cache would drop guards
	}
	return gs.SetGuards(ctx, a.ports.guards())
}
