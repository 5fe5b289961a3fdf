package agent

import (
	"context"
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
}

// plugResult is what a sync of a port did, for the callers of Attach and
// Detach waiting on it.
type plugResult struct {
	plugged bool
	err     error
}

// withAttachmentLocked fills the network namespace and interface name of
// a local port that has none from its attachment. Callers hold a.mu.
func (a *Agent) withAttachmentLocked(p *controllerapi.Port) {
	if netnsOf(p) != "" || !a.isLocal(p) {
		return
	}
	if at, ok := a.attach[p.ID]; ok {
		p.NetworkNS, p.VethName = at.NetNS, at.IfName
	}
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
		a.withAttachmentLocked(p)
	}
}

// Attach records where a port goes and waits until the agent has plugged
// it and reported it UP (or failed to). The port must be bound to this
// host; if the agent's watch has not delivered it yet, Attach waits for
// it. It returns the port as the controller acknowledged it.
func (a *Agent) Attach(ctx context.Context, portID string, at Attachment) (controllerapi.Port, error) {
	if at.NetNS == "" || at.NetNS[0] != '/' || at.IfName == "" {
		return controllerapi.Port{}, kerrors.New(kerrors.Invalid, "attach port %s: want an absolute netns path and an interface name", portID)
	}
	start := time.Now()
	ch := make(chan plugResult, 1)
	a.mu.Lock()
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
