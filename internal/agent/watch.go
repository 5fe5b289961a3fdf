package agent

import (
	"context"
	"errors"
	"iter"
	"net"
	"slices"
	"time"

	"kurma.dev/kurma/pkg/controllerapi"
)

// stream is one list-then-watch loop: a listing (ADDED events, then
// SYNCED) followed by live events, re-opened with backoff when it breaks.
type stream struct {
	name string
	// open starts the stream after revision since (0: with a listing).
	open func(ctx context.Context, since int64) iter.Seq2[controllerapi.Event, error]
	// resumable streams reopen after the last revision seen; the others
	// list again.
	resumable bool
	// apply handles an object event and returns the object's id ("" to
	// ignore the event).
	apply func(ev controllerapi.Event, listing bool) string
	// listed runs at the SYNCED that ends a listing, with the ids listed.
	listed func(ctx context.Context, seen map[string]bool)
	// broken runs after the stream broke, before it reopens (optional).
	broken func(ctx context.Context)
}

// run keeps s open until ctx ends.
func (a *Agent) run(ctx context.Context, s stream) {
	var rev int64
	delay := a.cfg.BackoffBase
	for ctx.Err() == nil {
		if !s.resumable {
			rev = 0
		}
		listing := rev == 0
		seen := map[string]bool{}
		for ev, err := range s.open(ctx, rev) {
			if err != nil {
				if errors.Is(err, controllerapi.ErrCompacted) {
					rev = 0
				}
				if ctx.Err() == nil {
					a.log.Warn(s.name+" watch broken", "err", err, "since", rev)
				}
				break
			}
			delay = a.cfg.BackoffBase
			if ev.Type == controllerapi.EventSynced {
				rev = ev.Revision
				if listing {
					listing = false
					s.listed(ctx, seen)
				}
				continue
			}
			id := s.apply(ev, listing)
			if id == "" {
				continue
			}
			if listing {
				seen[id] = true
			} else {
				rev = max(rev, ev.Revision)
			}
		}
		if !sleep(ctx, delay) {
			return
		}
		delay = min(delay*2, a.cfg.BackoffMax)
		if s.broken != nil {
			s.broken(ctx)
		}
	}
}

// watchPorts keeps the port cache current from the controller's view of
// this host: its own ports and the ports of the VPCs it has ports in. The
// stream lists on every (re)connect; at its SYNCED marker the ports that
// were not listed are dropped from the cache and a full resync is queued.
func (a *Agent) watchPorts(ctx context.Context) {
	a.run(ctx, stream{
		name: "port",
		open: func(ctx context.Context, _ int64) iter.Seq2[controllerapi.Event, error] {
			return a.c.WatchHostPorts(ctx, a.cfg.HostID)
		},
		apply: func(ev controllerapi.Event, _ bool) string {
			if ev.Port == nil || ev.Port.ID == "" {
				return ""
			}
			switch ev.Type {
			case controllerapi.EventAdded, controllerapi.EventModified:
				a.upsertPort(ev.Port)
			case controllerapi.EventDeleted:
				a.deletePort(ev.Port)
			default:
				return ""
			}
			return ev.Port.ID
		},
		listed: a.finishList,
		// The controller may have restarted or forgotten us: announce the
		// host again (best effort; the watch retries regardless).
		broken: func(ctx context.Context) {
			h := controllerapi.Host{ID: a.cfg.HostID, UnderlayIP: a.cfg.UnderlayIP.String()}
			if _, err := a.c.RegisterHost(ctx, h); err != nil && ctx.Err() == nil {
				a.log.Debug("re-register host", "err", err)
			}
		},
	})
}

// upsertPort stores a port (unless the cache has a newer revision) and
// queues what it affects.
func (a *Agent) upsertPort(p *controllerapi.Port) {
	a.mu.Lock()
	old := a.ports[p.ID]
	if old != nil && old.RevisionNumber > p.RevisionNumber {
		a.mu.Unlock()
		return
	}
	cp := *p
	refused := a.withAttachmentLocked(&cp)
	a.ports[p.ID] = &cp
	if since, ok := a.awaiting[p.ID]; ok {
		delete(a.awaiting, p.ID)
		a.m.observeAttach("port_wait", time.Since(since))
	}
	a.mu.Unlock()
	if refused != nil {
		a.log.Warn("attachment refused", "port", p.ID, "err", refused)
		a.notify(p.ID, plugResult{err: refused})
	}
	if old != nil && !datapathChange(old, &cp) {
		return // e.g. our own status report coming back
	}
	a.queueFor(&cp, old, false)
}

// datapathChange reports whether two versions of a port differ in what
// the datapath programs (status changes do not count).
func datapathChange(a, b *controllerapi.Port) bool {
	if a.BindingHostID != b.BindingHostID || a.VNI != b.VNI || a.MACAddress != b.MACAddress ||
		portSecurity(a) != portSecurity(b) || !slices.Equal(a.AllowedAddressPairs, b.AllowedAddressPairs) ||
		netnsOf(a) != netnsOf(b) || a.VethName != b.VethName || len(a.FixedIPs) != len(b.FixedIPs) ||
		adminUp(a) != adminUp(b) {
		return true
	}
	for i := range a.FixedIPs {
		if a.FixedIPs[i] != b.FixedIPs[i] {
			return true
		}
	}
	return false
}

func (a *Agent) deletePort(p *controllerapi.Port) {
	a.mu.Lock()
	old := a.ports[p.ID]
	delete(a.ports, p.ID)
	if a.isLocal(p) && p.VNI != 0 {
		a.forgetPeersLocked(p.VNI)
	}
	a.mu.Unlock()
	a.queueFor(p, old, true)
}

// forgetPeersLocked drops the cached remote ports of VPC vni when no local
// port is left in it: the controller stops sending their events at the
// same point of the stream (and sends them again, listed, when a local
// port brings the VPC back). Callers hold a.mu.
func (a *Agent) forgetPeersLocked(vni uint32) {
	for _, q := range a.ports {
		if q.VNI == vni && a.isLocal(q) {
			return
		}
	}
	for id, q := range a.ports {
		if q.VNI == vni {
			delete(a.ports, id)
		}
	}
}

// queueFor queues the keys a change of port p (formerly old; deleted when
// the port is gone) touches. A local port queues itself; its VPC only when
// the port leaves it (the port's own sync queues the VPC when it needs
// remotes), so a new port's plug does not wait behind a VPC sync. A
// remote port queues its VPC, whose remote entries change.
func (a *Agent) queueFor(p, old *controllerapi.Port, deleted bool) {
	if a.isLocal(p) || (old != nil && a.isLocal(old)) {
		a.q.Add(guardsKey)
		if a.lbEnabled() {
			// Which VPCs have local ports (and which FIPs point here) may
			// have changed.
			a.q.Add(lbKey)
		}
	}
	if a.isLocal(p) {
		a.q.Add(portKey(p.ID))
		if deleted && p.VNI != 0 {
			a.q.Add(vpcKey(p.VNI))
		}
	} else if p.VNI != 0 {
		a.q.Add(vpcKey(p.VNI))
	}
	if old == nil || (old.VNI == p.VNI && a.isLocal(old) == a.isLocal(p) && !deleted) {
		return
	}
	if a.isLocal(old) {
		a.q.Add(portKey(old.ID))
	}
	if old.VNI != 0 {
		a.q.Add(vpcKey(old.VNI))
	}
}

// finishList drops ports the list did not return, then queues a full
// level sync (which also finds orphans in the datapath).
func (a *Agent) finishList(ctx context.Context, seen map[string]bool) {
	a.mu.Lock()
	var gone []*controllerapi.Port
	for id, p := range a.ports {
		if !seen[id] {
			gone = append(gone, p)
			delete(a.ports, id)
		}
	}
	first := false
	select {
	case <-a.synced:
	default:
		close(a.synced)
		first = true
	}
	n := len(a.ports)
	a.mu.Unlock()
	for _, p := range gone {
		a.queueFor(p, nil, true)
	}
	a.log.Info("ports listed", "ports", n, "dropped", len(gone), "first", first)
	a.resync(ctx)
}

// watchHosts keeps the underlay address of every host; a change queues
// the VPCs that have local ports.
func (a *Agent) watchHosts(ctx context.Context) {
	a.run(ctx, stream{
		name:      "host",
		open:      a.c.WatchHosts,
		resumable: true,
		apply: func(ev controllerapi.Event, listing bool) string {
			if ev.Host == nil || ev.Host.ID == "" {
				return ""
			}
			a.mu.Lock()
			switch ev.Type {
			case controllerapi.EventDeleted:
				delete(a.hosts, ev.Host.ID)
			case controllerapi.EventAdded, controllerapi.EventModified:
				if ip := net.ParseIP(ev.Host.UnderlayIP); ip != nil {
					a.hosts[ev.Host.ID] = ip
				}
			}
			a.mu.Unlock()
			if !listing {
				a.queueLocalVPCs()
			}
			return ev.Host.ID
		},
		listed: func(ctx context.Context, seen map[string]bool) {
			a.mu.Lock()
			for id := range a.hosts {
				if !seen[id] {
					delete(a.hosts, id)
				}
			}
			first := !isClosed(a.hostsSeen)
			closeOnce(a.hostsSeen)
			a.mu.Unlock()
			a.queueLocalVPCs()
			if first {
				// VPC syncs waited for this listing, the resync that
				// finds orphan VPCs among them.
				a.resync(ctx)
			}
		},
	})
}

func (a *Agent) queueLocalVPCs() {
	a.mu.Lock()
	vnis := map[uint32]bool{}
	for _, p := range a.ports {
		if a.isLocal(p) && p.VNI != 0 {
			vnis[p.VNI] = true
		}
	}
	a.mu.Unlock()
	for vni := range vnis {
		a.q.Add(vpcKey(vni))
	}
}

func adminUp(p *controllerapi.Port) bool { return p.AdminStateUp == nil || *p.AdminStateUp }

func portSecurity(p *controllerapi.Port) bool {
	return p.PortSecurityEnabled == nil || *p.PortSecurityEnabled
}
