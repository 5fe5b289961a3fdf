package agent

import (
	"context"
	"net"
	"sync"
	"time"

	"kurma.dev/kurma/internal/agent/datapath"
)

// vpcState is what the agent programmed per VPC (queue keys "v/<vni>"),
// and the lock that orders the work on each VPC: deleting it takes it
// exclusively; plugging a port into the VPC, ensuring it and setting its
// remotes share it (ensures take turns at the VPC's ensure lock, so one
// ensure runs for a burst's first plugs); a worker holds at most one VPC lock at a time, and the ensure
// lock only under it. mu guards the maps only and is never held across a
// datapath call.
type vpcState struct {
	mu       sync.Mutex
	ready    map[uint32]bool            // VPCs whose remotes are programmed
	gateways map[uint32]map[string]bool // gateways each VPC was last ensured with
	empty    map[uint32]time.Time       // when a VPC was first seen without local ports (linger)
	locks    map[uint32]*sync.RWMutex   // one per VNI: shared by plugs and ensures, exclusive for the VPC's removal
	ensuring map[uint32]*sync.Mutex     // one per VNI: ensureVPC's, under the VPC's lock
}

func newVPCState() *vpcState {
	return &vpcState{ready: map[uint32]bool{}, gateways: map[uint32]map[string]bool{},
		empty: map[uint32]time.Time{}, locks: map[uint32]*sync.RWMutex{}, ensuring: map[uint32]*sync.Mutex{}}
}

// lock returns the mutex that serialises work on one VPC.
func (v *vpcState) lock(vni uint32) *sync.RWMutex {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.locks[vni]
	if m == nil {
		m = &sync.RWMutex{}
		v.locks[vni] = m
	}
	return m
}

// ensureLock returns the mutex that ensureVPC takes, under the VPC's
// lock, so that the VPC is ensured once at a time.
func (v *vpcState) ensureLock(vni uint32) *sync.Mutex {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.ensuring[vni]
	if m == nil {
		m = &sync.Mutex{}
		v.ensuring[vni] = m
	}
	return m
}

// has reports whether the VPC was ensured with every gateway in gws, so
// a plug may skip EnsureVPC (a stale answer only costs a failed Plug,
// which forgets the VPC and retries).
func (v *vpcState) has(vni uint32, gws []net.IPNet) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	set := v.gateways[vni]
	if set == nil {
		return false
	}
	for _, g := range gws {
		if !set[g.String()] {
			return false
		}
	}
	return true
}

// setGateways records the gateways a VPC was ensured with and returns
// those it had been ensured with before that it no longer has.
func (v *vpcState) setGateways(vni uint32, gws []net.IPNet) (gone []string) {
	set := map[string]bool{}
	for _, g := range gws {
		set[g.String()] = true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for g := range v.gateways[vni] {
		if !set[g] {
			gone = append(gone, g)
		}
	}
	v.gateways[vni] = set
	return gone
}

// forget makes the next plug or sync ensure the VPC in full.
func (v *vpcState) forget(vni uint32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.gateways, vni)
}

// used records that the VPC has a local port (a later empty spell
// lingers in full) and reports whether its remotes still need
// programming.
func (v *vpcState) used(vni uint32) (needRemotes bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.empty, vni)
	return !v.ready[vni]
}

func (v *vpcState) setReady(vni uint32, ready bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ready {
		v.ready[vni] = true
	} else {
		delete(v.ready, vni)
	}
}

// drop forgets a removed VPC.
func (v *vpcState) drop(vni uint32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.ready, vni)
	delete(v.gateways, vni)
	delete(v.empty, vni)
}

// lingerLeft says how much longer an empty VPC is kept: it starts the
// clock the first time the VPC is found empty. A VPC the agent never
// programmed itself (an orphan found by a resync, or one left by an
// earlier run) is not kept.
func (v *vpcState) lingerLeft(vni uint32, linger time.Duration, now time.Time) time.Duration {
	if linger <= 0 {
		return 0
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gateways[vni] == nil && v.empty[vni].IsZero() {
		return 0
	}
	since, ok := v.empty[vni]
	if !ok {
		since = now
		v.empty[vni] = since
	}
	return linger - now.Sub(since)
}

// ensureVPC creates or repairs the VPC with the gateways of every local
// port in it (plus extra's) and of the subnets of its remote ports: a
// local pod reaches a pod of another subnet that has no port on this host
// only when that subnet is on-link here (routed between the bridge's
// gateways, then bridged to the VXLAN device). The caller holds the VPC's
// lock, shared at least; ensures of one VPC (a plug's, a sync's) take
// turns at its ensure lock, so that the gateways recorded are those of
// the last EnsureVPC. A plug's ensure (extra given) that finds, once its
// turn comes, the VPC ensured with extra's gateways (by the plug before
// it) does nothing.
func (a *Agent) ensureVPC(ctx context.Context, vni uint32, extra ...datapath.PortSpec) error {
	e := a.vpcs.ensureLock(vni)
	if f := a.cfg.hooks.ensureWants; f != nil {
		f(vni)
	}
	e.Lock()
	defer e.Unlock()
	if len(extra) > 0 && a.vpcs.has(vni, gatewaysOf(extra)) {
		return nil
	}
	specs := append(a.localSpecs(vni), extra...)
	_, remoteGWs := a.ports.remotes(vni)
	gws := gatewaysOf(append(specs, remoteGWs...))
	if err := a.dp.EnsureVPC(ctx, datapath.VPCSpec{VNI: vni, Gateways: gws}); err != nil {
		return err
	}
	if gone := a.vpcs.setGateways(vni, gws); len(gone) > 0 {
		// Rare (a subnet's last port here and on the remote hosts
		// left), and every local pod of that subnet loses its
		// gateway: worth a line when it is not expected.
		a.log.Info("vpc gateways removed", "vni", vni, "gateways", gone, "local_ports", len(specs)-len(extra))
	}
	return nil
}

// syncVPC programs a VPC's remote ports, or removes the VPC when no local
// port uses it any more.
func (a *Agent) syncVPC(ctx context.Context, vni uint32) error {
	l := a.vpcs.lock(vni)
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
	wait := a.vpcs.lingerLeft(vni, a.cfg.VPCLinger, a.cfg.hooks.now())
	if wait > 0 {
		// Keep the VPC a while for the next pod; look again then.
		// Remote changes are not programmed meanwhile, so the next
		// plug must queue a full VPC sync.
		a.vpcs.setReady(vni, false)
		a.q.AddAfter(vpcKey(vni), wait)
		a.lingered(vni, wait)
		return nil
	}
	a.vpcs.drop(vni)
	if err := a.dp.DeleteVPC(ctx, vni); err != nil {
		return err
	}
	a.lingered(vni, wait)
	return nil
}

// lingered tells a test's hook what syncVPC decided on an empty VPC.
func (a *Agent) lingered(vni uint32, left time.Duration) {
	if f := a.cfg.hooks.lingered; f != nil {
		f(vni, left)
	}
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
	a.vpcs.used(vni)
	remotes, _ := a.ports.remotes(vni)
	if err := a.ensureVPC(ctx, vni); err != nil {
		a.vpcs.forget(vni)
		return true, err
	}
	if err := a.dp.SetRemotes(ctx, vni, remotes); err != nil {
		return true, err
	}
	a.vpcs.setReady(vni, true)
	return true, nil
}

// localSpecs converts the local ports of a VPC, placed where their
// attachments say (place), skipping those that cannot be converted
// without a round trip.
func (a *Agent) localSpecs(vni uint32) []datapath.PortSpec {
	var out []datapath.PortSpec
	for _, p := range a.ports.local(vni) {
		a.att.fill(&p, a.cfg.LocalAttach)
		if s, err := toPortSpec(&p); err == nil {
			out = append(out, s)
		}
	}
	return out
}
