package agent

import (
	"context"
	"errors"
	"fmt"
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

// plugResult is what a sync of a port did, for the callers of Attach and
// Detach waiting on it.
type plugResult struct {
	plugged bool
	err     error
}

// withAttachmentLocked fills the network namespace and interface name of
// a local port that has none from its attachment. An attachment that
// names another device than the port's is dropped, and returned as an
// error for its waiters (notify, once a.mu is released). Callers hold
// a.mu.
func (a *Agent) withAttachmentLocked(p *controllerapi.Port) error {
	if netnsOf(p) != "" || !a.isLocal(p) {
		return nil
	}
	at, ok := a.attach[p.ID]
	if !ok {
		return nil
	}
	if err := at.owns(p); err != nil {
		delete(a.attach, p.ID)
		return err
	}
	p.NetworkNS, p.VethName = at.NetNS, at.IfName
	return nil
}

// unattached reports whether a local port waits for an attachment: the
// agent runs with Config.LocalAttach and neither the controller nor an
// attachment says where the port goes.
func (a *Agent) unattached(p *controllerapi.Port) bool {
	return a.cfg.LocalAttach && netnsOf(p) == ""
}

// Restore records an attachment without waiting (the CNI daemon replays
// its saved attachments before Run after a restart).
func (a *Agent) Restore(portID string, at Attachment) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.attach[portID] = at
	if p := a.ports[portID]; p != nil {
		if err := a.withAttachmentLocked(p); err != nil {
			a.log.Warn("restored attachment refused", "port", portID, "err", err)
		}
	}
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
	ch := make(chan plugResult, 1)
	a.mu.Lock()
	for {
		old, ok := a.attach[portID]
		if !ok || old.NetNS == at.NetNS {
			break
		}
		a.mu.Unlock() // no file calls under a.mu
		gone, _ := netnsGone(old.NetNS)
		if !gone {
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w (%w): attached to %s, which still exists", portID, ErrNotOwned, kerrors.Conflict, old.NetNS)
		}
		a.mu.Lock()
		if cur, ok := a.attach[portID]; ok && cur == old {
			break // gone: the new sandbox takes the port
		}
	}
	if p := a.ports[portID]; p != nil {
		if err := at.owns(p); err != nil {
			a.mu.Unlock()
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, err)
		}
	}
	a.attach[portID] = at
	if p := a.ports[portID]; p != nil {
		if a.isLocal(p) {
			p.NetworkNS, p.VethName = at.NetNS, at.IfName
		}
		a.m.observeAttach("port_wait", 0)
	} else if _, ok := a.awaiting[portID]; !ok {
		a.awaiting[portID] = start // upsertPort observes the wait
	}
	a.waiters[portID] = append(a.waiters[portID], ch)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.awaiting, portID)
		a.mu.Unlock()
	}()
	a.q.AddUrgent(portKey(portID)) // a CNI ADD or DEL waits on it
	for {
		select {
		case <-ctx.Done():
			a.dropWaiter(portID, ch)
			return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, ctx.Err())
		case r := <-ch:
			if r.err != nil {
				return controllerapi.Port{}, fmt.Errorf("attach port %s: %w", portID, r.err)
			}
			if r.plugged {
				a.m.observeAttach("plugged", time.Since(start))
				p, _ := a.cachedPort(portID)
				return p, nil
			}
			// An unplug (e.g. a sync queued before this attach): wait on.
			a.mu.Lock()
			a.waiters[portID] = append(a.waiters[portID], ch)
			a.mu.Unlock()
		}
	}
}

// Detach forgets a port's attachment and waits until the agent has
// unplugged it. Detaching a port that is not attached is not an error.
func (a *Agent) Detach(ctx context.Context, portID string) error {
	select {
	case <-a.synced:
	case <-ctx.Done():
		return fmt.Errorf("detach port %s: waiting for the first port list: %w", portID, ctx.Err())
	}
	ch := make(chan plugResult, 1)
	a.mu.Lock()
	delete(a.attach, portID)
	if p := a.ports[portID]; p != nil && a.cfg.LocalAttach {
		// The controller's copy has no namespace; forget the attachment's.
		p.NetworkNS, p.VethNamespace, p.VethName = "", "", ""
	}
	a.waiters[portID] = append(a.waiters[portID], ch)
	a.mu.Unlock()
	a.q.AddUrgent(portKey(portID)) // a CNI ADD or DEL waits on it
	retried := false
	for {
		select {
		case <-ctx.Done():
			a.dropWaiter(portID, ch)
			return fmt.Errorf("detach port %s: %w", portID, ctx.Err())
		case r := <-ch:
			if r.err != nil && !retried {
				// The result may be that of a sync which began before
				// the attachment was forgotten (its namespace gone, say):
				// the queue runs the key again after it, and that sync's
				// outcome is the one that answers this Detach.
				retried = true
				a.mu.Lock()
				a.waiters[portID] = append(a.waiters[portID], ch)
				a.mu.Unlock()
				a.q.AddUrgent(portKey(portID))
				continue
			}
			if r.err != nil {
				return fmt.Errorf("detach port %s: %w", portID, r.err)
			}
			if !r.plugged {
				return nil
			}
			a.mu.Lock()
			a.waiters[portID] = append(a.waiters[portID], ch)
			a.mu.Unlock()
		}
	}
}

func (a *Agent) dropWaiter(portID string, ch chan plugResult) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ws := a.waiters[portID]
	for i, w := range ws {
		if w == ch {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(a.waiters, portID)
	} else {
		a.waiters[portID] = ws
	}
}

// notify hands a port's sync outcome to everyone waiting on it.
func (a *Agent) notify(portID string, r plugResult) {
	a.mu.Lock()
	ws := a.waiters[portID]
	delete(a.waiters, portID)
	a.mu.Unlock()
	for _, w := range ws {
		w <- r // buffered, one result per registration
	}
}

// notifyDetached tells the waiting callers of Detach (only) that a port
// the agent no longer knows is unplugged; an Attach keeps waiting for the
// port to arrive.
func (a *Agent) notifyDetached(portID string, err error) {
	a.mu.Lock()
	_, attached := a.attach[portID]
	a.mu.Unlock()
	if !attached {
		a.notify(portID, plugResult{err: err})
	}
}
