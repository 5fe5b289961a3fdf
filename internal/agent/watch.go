package agent

import (
	"context"
	"errors"
	"iter"
	"net"
	"slices"

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
	old, stored := a.ports.upsert(p)
	if !stored {
		return
	}
	if d, ok := a.att.arrived(p.ID); ok {
		a.m.observeAttach("port_wait", d)
	}
	if old != nil && !datapathChange(old, p) {
		return // e.g. our own status report coming back
	}
	a.queueFor(p, old, false)
}

// datapathChange reports whether two versions of a port differ in what
// the datapath programs (status changes do not count), or in the device
// an attachment must name.
func datapathChange(a, b *controllerapi.Port) bool {
	if a.BindingHostID != b.BindingHostID || a.DeviceID != b.DeviceID || a.DeviceOwner != b.DeviceOwner || a.VNI != b.VNI || a.MACAddress != b.MACAddress ||
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
	old := a.ports.remove(p)
	a.queueFor(p, old, true)
}

// queueFor queues the keys a change of port p (formerly old; deleted when
// the port is gone) touches. A local port queues itself; its VPC only when
// the port leaves it (the port's own sync queues the VPC when it needs
// remotes), so a new port's plug does not wait behind a VPC sync. A
// remote port queues its VPC, whose remote entries change.
func (a *Agent) queueFor(p, old *controllerapi.Port, deleted bool) {
	if a.ports.isLocal(p) || (old != nil && a.ports.isLocal(old)) {
		a.q.Add(guardsKey)
		if a.lbEnabled() {
			// Which VPCs have local ports (and which FIPs point here) may
			// have changed.
			a.q.Add(lbKey)
		}
	}
	if a.ports.isLocal(p) {
		a.q.Add(portKey(p.ID))
		if deleted && p.VNI != 0 {
			a.q.Add(vpcKey(p.VNI))
		}
	} else if p.VNI != 0 {
		a.q.Add(vpcKey(p.VNI))
	}
	if old == nil || (old.VNI == p.VNI && a.ports.isLocal(old) == a.ports.isLocal(p) && !deleted) {
		return
	}
	if a.ports.isLocal(old) {
		a.q.Add(portKey(old.ID))
	}
	if old.VNI != 0 {
		a.q.Add(vpcKey(old.VNI))
	}
}

// finishList drops ports the list did not return, then queues a full
// level sync (which also finds orphans in the datapath).
func (a *Agent) finishList(ctx context.Context, seen map[string]bool) {
	gone, first, n := a.ports.retain(seen)
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
			switch ev.Type {
			case controllerapi.EventDeleted:
				a.ports.setHost(ev.Host.ID, nil)
			case controllerapi.EventAdded, controllerapi.EventModified:
				if ip := net.ParseIP(ev.Host.UnderlayIP); ip != nil {
					a.ports.setHost(ev.Host.ID, ip)
				}
			}
			if !listing {
				a.queueLocalVPCs()
			}
			return ev.Host.ID
		},
		listed: func(ctx context.Context, seen map[string]bool) {
			first := a.ports.retainHosts(seen)
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
	_, vnis := a.ports.localIDs()
	for vni := range vnis {
		a.q.Add(vpcKey(vni))
	}
}

func adminUp(p *controllerapi.Port) bool { return p.AdminStateUp == nil || *p.AdminStateUp }

func portSecurity(p *controllerapi.Port) bool {
	return p.PortSecurityEnabled == nil || *p.PortSecurityEnabled
}
