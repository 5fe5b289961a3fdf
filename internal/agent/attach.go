package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Attachment says where a port bound to this host goes when its creator
// could not know (the Kubernetes watcher creates a pod's port before the
// pod's sandbox, and its network namespace, exist): the CNI daemon
// (internal/kube/cnid) learns it from the runtime's ADD and attaches it.
type Attachment struct {
	NetNS  string // absolute path of the pod's network namespace
	IfName string // interface name inside it
	// DeviceID and DeviceOwner, when set, must be the device_id and
	// device_owner of the controller's record of the port: the caller
	// names the port from input that others can write (a pod annotation),
	// and the agent plugs only the port made for that device.
	DeviceID, DeviceOwner string
}

// ErrNotOwned is the error (also kerrors.Conflict) of an Attach whose
// port belongs to another device than the attachment names, or is
// attached to another network namespace that still exists.
var ErrNotOwned = errors.New("port not owned by the attachment")

// owns reports why the port is not the attachment's, or nil.
func (at Attachment) owns(p *controllerapi.Port) error {
	if (at.DeviceID != "" && p.DeviceID != at.DeviceID) || (at.DeviceOwner != "" && p.DeviceOwner != at.DeviceOwner) {
		return fmt.Errorf("%w (%w): port %s is device %q of %q, not %q of %q", ErrNotOwned, kerrors.Conflict,
			p.ID, p.DeviceID, p.DeviceOwner, at.DeviceID, at.DeviceOwner)
	}
	return nil
}

// PortHasAddr reports whether the agent's record of port portID (from
// the controller: a port of this host, or of a VPC it has ports in) is
// device deviceID of deviceOwner and has the fixed address ip. The
// NetworkPolicy controller asks it before it trusts an address that a pod
// has only in its annotation, which the pod's editors can write.
func (a *Agent) PortHasAddr(portID, deviceID, deviceOwner string, ip netip.Addr) bool {
	p, ok := a.ports.get(portID)
	if !ok || p.DeviceID != deviceID || p.DeviceOwner != deviceOwner {
		return false
	}
	for _, f := range p.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil && a == ip {
			return true
		}
	}
	return false
}

// plugResult is what a sync of a port did, for the callers of Attach and
// Detach waiting on it.
type plugResult struct {
	plugged bool
	err     error
}

// attachments is where the CNI daemon said local ports go (LocalAttach),
// and who waits on their plugs. mu guards the maps only; it is never held
// across a sync, nor while another of the agent's locks is taken.
type attachments struct {
	mu       sync.Mutex
	byPort   map[string]Attachment        // by port id
	waiters  map[string][]chan plugResult // callers of Attach/Detach by port id
	awaiting map[string]time.Time         // Attach calls waiting for their port to arrive, since when
	plugging map[string]int               // ports whose plug is under way (VPC ensure and datapath), by port id
}

func newAttachments() *attachments {
	return &attachments{byPort: map[string]Attachment{}, waiters: map[string][]chan plugResult{},
		awaiting: map[string]time.Time{}, plugging: map[string]int{}}
}

func (t *attachments) get(portID string) (Attachment, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.byPort[portID]
	return at, ok
}

// fill sets the namespace and interface name of a port that has none
// from its attachment (with localAttach only), when the attachment is
// the port's own. It reports whether the port has a place.
func (t *attachments) fill(p *controllerapi.Port, localAttach bool) bool {
	if !localAttach || netnsOf(p) != "" {
		return true
	}
	at, ok := t.get(p.ID)
	if !ok || at.owns(p) != nil {
		return false
	}
	p.NetworkNS, p.VethName = at.NetNS, at.IfName
	return true
}

// drop forgets an attachment if it is still at.
func (t *attachments) drop(portID string, at Attachment) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.byPort[portID]; ok && cur == at {
		delete(t.byPort, portID)
	}
}

// arrived ends the wait of an Attach for its port (the first of the
// port's arrival and Attach's own look at the cache) and returns how long
// it waited (ok false: no wait to end).
func (t *attachments) arrived(portID string) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	since, ok := t.awaiting[portID]
	delete(t.awaiting, portID)
	return time.Since(since), ok
}

// plugStarted and plugEnded bracket an urgent sync of a port (syncPort)
// and any plug of it (plug, from an urgent or a plain sync). The plug of
// an urgent sync is inside the sync's bracket: the brackets nest, so they
// count.
func (t *attachments) plugStarted(portID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.plugging[portID]++
}

func (t *attachments) plugEnded(portID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.plugging[portID]--; t.plugging[portID] <= 0 {
		delete(t.plugging, portID)
	}
}

// Plugging reports whether the agent has the port's plug in hand: an
// urgent sync of the port or its plug under way (VPC ensure, datapath),
// most likely waiting for the kernel (the RTNL lock, sysfs), or, the port
// known, its urgent sync queued behind attach workers that are all busy
// so. The CNI daemon gives such an ADD more time than one whose port has
// not come (cnid's Config.PlugGrace): a kernel stall of a pod burst ends,
// and failing an ADD in the middle of its plug costs the node a whole new
// sandbox.
func (a *Agent) Plugging(portID string) bool {
	a.att.mu.Lock()
	n := a.att.plugging[portID]
	a.att.mu.Unlock()
	if n > 0 {
		return true
	}
	_, known := a.ports.get(portID)
	return known && a.q.UrgentQueued(portKey(portID))
}

func (t *attachments) addWaiter(portID string, ch chan plugResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.waiters[portID] = append(t.waiters[portID], ch)
}

func (t *attachments) dropWaiter(portID string, ch chan plugResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.waiters[portID]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(t.waiters, portID)
	} else {
		t.waiters[portID] = ws
	}
}

// notify hands a port's sync outcome to everyone waiting on it.
func (t *attachments) notify(portID string, r plugResult) {
	t.mu.Lock()
	ws := t.waiters[portID]
	delete(t.waiters, portID)
	t.mu.Unlock()
	for _, w := range ws {
		w <- r // buffered, one result per registration
	}
}

// notifyDetached tells the waiting callers of Detach (only) that a port
// the agent no longer knows is unplugged; an Attach keeps waiting for the
// port to arrive.
func (t *attachments) notifyDetached(portID string, err error) {
	if _, attached := t.get(portID); !attached {
		t.notify(portID, plugResult{err: err})
	}
}

// place fills the namespace of a local port from its attachment (see
// attachments.fill) and reports whether the port has a place to be
// plugged. An attachment that names another device than the port's
// record is dropped, and its waiters get the error.
func (a *Agent) place(p *controllerapi.Port) bool {
	if a.att.fill(p, a.cfg.LocalAttach) {
		return true
	}
	if at, ok := a.att.get(p.ID); ok {
		if err := at.owns(p); err != nil {
			a.att.drop(p.ID, at)
			a.log.Warn("attachment refused", "port", p.ID, "err", err)
			a.att.notify(p.ID, plugResult{err: err})
		}
	}
	return false
}

// Restore records an attachment without waiting (the CNI daemon replays
// its saved attachments before Run after a restart). The port's sync
// checks it against the port's record.
func (a *Agent) Restore(portID string, at Attachment) {
	a.att.mu.Lock()
	defer a.att.mu.Unlock()
	a.att.byPort[portID] = at
}

// Attach records where a port goes and waits until the agent has plugged
// it (or failed to); the UP report to the controller follows. The port
// must be bound to this host; if the agent's watch has not delivered it
// yet, Attach waits for it. It returns the port as the agent has it.
//
// Attach never moves a port that is attached to another network
// namespace that still exists (a live sandbox: its DEL comes first), nor
// one whose controller record names another device than at does: both
// fail with ErrNotOwned, and the port stays where it is.
func (a *Agent) Attach(ctx context.Context, portID string, at Attachment) (controllerapi.Port, error) {
	if at.NetNS == "" || at.NetNS[0] != '/' || at.IfName == "" {
		return controllerapi.Port{}, kerrors.New(kerrors.Invalid, "attach port %s: want an absolute netns path and an interface name", portID)
	}
	start := time.Now()
	if p, ok := a.ports.get(portID); ok {
		if err := at.owns(&p); err != nil {
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, err)
		}
	}
	ch := make(chan plugResult, 1)
	t := a.att
	t.mu.Lock()
	for {
		old, ok := t.byPort[portID]
		if !ok || old.NetNS == at.NetNS {
			break
		}
		t.mu.Unlock() // no file calls under the lock
		gone, _ := netnsGone(old.NetNS)
		if !gone {
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w (%w): attached to %s, which still exists", portID, ErrNotOwned, kerrors.Conflict, old.NetNS)
		}
		t.mu.Lock()
		if cur, ok := t.byPort[portID]; ok && cur == old {
			break // gone: the new sandbox takes the port
		}
	}
	t.byPort[portID] = at
	if _, ok := t.awaiting[portID]; !ok {
		t.awaiting[portID] = start // ended by the port's arrival, or just below
	}
	t.waiters[portID] = append(t.waiters[portID], ch)
	t.mu.Unlock()
	if _, ok := a.ports.get(portID); ok {
		if _, ok := t.arrived(portID); ok {
			a.m.observeAttach("port_wait", 0)
		}
	}
	defer t.arrived(portID)
	a.q.AddUrgent(portKey(portID)) // a CNI ADD or DEL waits on it
	for {
		select {
		case <-ctx.Done():
			t.dropWaiter(portID, ch)
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, ctx.Err())
		case r := <-ch:
			if r.err != nil {
				return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, r.err)
			}
			if r.plugged {
				a.m.observeAttach("plugged", time.Since(start))
				p, _ := a.ports.get(portID)
				a.att.fill(&p, a.cfg.LocalAttach)
				return p, nil
			}
			// An unplug (e.g. a sync queued before this attach): wait on.
			t.addWaiter(portID, ch)
		}
	}
}

// Detach forgets a port's attachment and waits until the agent has
// unplugged it. Detaching a port that is not attached is not an error.
func (a *Agent) Detach(ctx context.Context, portID string) error {
	select {
	case <-a.ports.synced:
	case <-ctx.Done():
		return fmt.Errorf("detach port %s: waiting for the first port list: %w", portID, ctx.Err())
	}
	ch := make(chan plugResult, 1)
	t := a.att
	t.mu.Lock()
	delete(t.byPort, portID)
	t.waiters[portID] = append(t.waiters[portID], ch)
	t.mu.Unlock()
	a.q.AddUrgent(portKey(portID)) // a CNI ADD or DEL waits on it
	retried := false
	for {
		select {
		case <-ctx.Done():
			t.dropWaiter(portID, ch)
			return fmt.Errorf("detach port %s: %w", portID, ctx.Err())
		case r := <-ch:
			if r.err != nil && !retried {
				// The result may be that of a sync which began before
				// the attachment was forgotten (its namespace gone, say):
				// the queue runs the key again after it, and that sync's
				// outcome is the one that answers this Detach.
				retried = true
				t.addWaiter(portID, ch)
				a.q.AddUrgent(portKey(portID))
				continue
			}
			if r.err != nil {
				return fmt.Errorf("detach port %s: %w", portID, r.err)
			}
			if !r.plugged {
				return nil
			}
			t.addWaiter(portID, ch)
		}
	}
}
