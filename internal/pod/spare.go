package pod

// A warm spare: one stage-init child kept started in fresh namespaces
// (mount, UTS, IPC, PID, network), waiting on fd 3 for a pod's config. Taking it
// removes the process start and Go runtime start-up of stage-init from a
// pod's start (tens of milliseconds on a busy machine). It holds no mount
// on the host and nothing of a pod: if unused it is killed on Close, and
// it exits by itself when kurmad dies (its socket reads EOF). Pods with
// host networking always get a fresh stage-init.

// takeSpare returns the warm spare, if any, and starts making the next.
func (r *Runtime) takeSpare() *launched {
	if r.opts.NoSpare {
		return nil
	}
	r.spareMu.Lock()
	p := r.spare
	r.spare = nil
	r.spareMu.Unlock()
	r.refillSpare()
	return p
}

// refillSpare starts a new spare in the background unless one exists or
// is being made.
func (r *Runtime) refillSpare() {
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.wg.Add(1)
	}
	r.mu.Unlock()
	if closed {
		return
	}
	r.spareMu.Lock()
	if r.spare != nil || r.spareBusy {
		r.spareMu.Unlock()
		r.wg.Done()
		return
	}
	r.spareBusy = true
	r.spareMu.Unlock()
	go func() {
		defer r.wg.Done()
		p, err := r.spawn(spareArg, nil, false)
		r.spareMu.Lock()
		r.spareBusy = false
		if err != nil {
			r.spareMu.Unlock()
			r.log.Warn("start spare stage-init", "err", err)
			return
		}
		if r.isClosed() || r.spare != nil {
			r.spareMu.Unlock()
			p.abandon()
			return
		}
		r.spare = p
		r.spareMu.Unlock()
	}()
}

// dropSpare kills the unused spare (on Close).
func (r *Runtime) dropSpare() {
	r.spareMu.Lock()
	p := r.spare
	r.spare = nil
	r.spareMu.Unlock()
	if p != nil {
		p.abandon()
	}
}
