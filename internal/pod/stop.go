package pod

import (
	"context"
	"fmt"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// Get finds a pod by UUID, name or unique UUID prefix.
func (r *Runtime) Get(ctx context.Context, ref string) (*Pod, error) {
	e, err := r.lookup(ref)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.snapshot(), nil
}

// List returns every pod known, oldest first (including exited ones).
func (r *Runtime) List(ctx context.Context) ([]*Pod, error) {
	r.mu.Lock()
	out := make([]*Pod, 0, len(r.pods))
	for _, e := range r.pods {
		out = append(out, e.snapshot())
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].UUID < out[j].UUID
	})
	return out, nil
}

// Stop sends SIGTERM to the stager, SIGKILL after grace, and waits for the
// pod to be torn down. Stopping a pod that has ended already is a no-op.
func (r *Runtime) Stop(ctx context.Context, ref string, grace time.Duration) error {
	defer r.busy()()
	e, err := r.lookup(ref)
	if err != nil {
		return err
	}
	return r.stop(ctx, e, grace, true)
}

// stop is Stop; keepStatus asks the stager for the apps' status first (not
// worth it for a pod about to be removed).
func (r *Runtime) stop(ctx context.Context, e *entry, grace time.Duration, keepStatus bool) error {
	r.mu.Lock()
	state := e.rec.Pod.State
	switch state {
	case Exited, Errored:
		r.mu.Unlock()
		return nil
	case Creating:
		r.mu.Unlock()
		return kerrors.New(kerrors.Conflict, "pod %s is still being created", e.rec.Pod.Name)
	}
	r.mu.Unlock()
	// Keep the apps' last status in the record: once the stager is gone
	// nobody can tell it any more. Best effort, briefly bounded.
	if state == Running && keepStatus {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		if st, err := r.Status(sctx, e.rec.Pod.UUID); err == nil {
			r.recordStatus(e, st)
		}
		cancel()
	}
	r.mu.Lock()
	e.rec.Stopping = true
	e.rec.Pod.State = Stopping
	removing := e.removing
	r.mu.Unlock()
	// A pod being removed goes at once: no record of its stopping (a
	// restart meanwhile finds its stager gone and tears it down), no
	// SIGTERM (there is no grace).
	if !removing {
		if err := r.save(e, false); err != nil {
			return err
		}
		r.signal(e, unix.SIGTERM)
		select {
		case <-e.exited:
			return nil
		case <-time.After(grace):
		case <-ctx.Done():
			return fmt.Errorf("stop pod %s: %w", e.rec.Pod.Name, ctx.Err())
		}
	}
	r.signal(e, unix.SIGKILL)
	select {
	case <-e.exited:
		return nil
	case <-time.After(30 * time.Second):
		return kerrors.New(kerrors.Timeout, "pod %s did not exit after SIGKILL", e.rec.Pod.Name)
	case <-ctx.Done():
		return fmt.Errorf("stop pod %s: %w", e.rec.Pod.Name, ctx.Err())
	}
}

// Remove deletes an ended pod's record, folders, volumes and image leases;
// with force it stops a running pod first (no grace).
func (r *Runtime) Remove(ctx context.Context, ref string, force bool) error {
	defer r.busy()()
	e, err := r.lookup(ref)
	if err != nil {
		return err
	}
	r.mu.Lock()
	state := e.rec.Pod.State
	r.mu.Unlock()
	switch state {
	case Exited, Errored:
	case Creating:
		return kerrors.New(kerrors.Conflict, "pod %s is still being created", e.rec.Pod.Name)
	default:
		if !force {
			return kerrors.New(kerrors.Conflict, "pod %s is %s; stop it first or force the removal", e.rec.Pod.Name, state)
		}
		r.mu.Lock()
		e.removing = true
		r.mu.Unlock()
		if err := r.stop(ctx, e, 0, false); err != nil {
			return err
		}
	}
	e.op.Lock()
	defer e.op.Unlock()
	r.teardown(ctx, e)
	if e.rec.Leased {
		if err := r.opts.Images.Unlease(ctx, e.rec.Pod.UUID); err != nil {
			return fmt.Errorf("remove pod %s: %w", e.rec.Pod.Name, err)
		}
	}
	if err := r.removeFiles(ctx, e); err != nil {
		return fmt.Errorf("remove pod %s: %w", e.rec.Pod.Name, err)
	}
	r.mu.Lock()
	delete(r.pods, e.rec.Pod.UUID)
	r.mu.Unlock()
	return nil
}

// signal sends sig to a pod's stager through its pidfd. It holds mu so the
// pidfd cannot be closed (and its number reused) meanwhile.
func (r *Runtime) signal(e *entry, sig unix.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.pidfd >= 0 {
		_ = unix.PidfdSendSignal(e.pidfd, sig, nil, 0)
	}
}

// recordStatus stores the apps' status in the pod's record.
func (r *Runtime) recordStatus(e *entry, st stagerspec.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, a := range e.rec.Pod.Apps {
		if as, ok := st[a.Name]; ok {
			as := as
			e.rec.Pod.Apps[i].Status = &as
		}
	}
}
