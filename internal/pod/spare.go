package pod

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/pod/stageinit"
)

// A warm spare: one stage-init child kept started in fresh namespaces
// (mount, UTS, IPC, PID, network), waiting on fd 3 for a pod's config. Taking it
// removes the process start and Go runtime start-up of stage-init from a
// pod's start (tens of milliseconds on a busy machine). It holds no mount
// on the host and nothing of a pod: if unused it is killed on Close, and
// it exits by itself when kurmad dies (its socket reads EOF). Pods with
// host networking always get a fresh stage-init.
//
// Its mount namespace is a copy of the host's. Where the host's mounts are
// shared, unmounts reach the copy; where they are private (a root that is
// not shared, as on hosts without systemd), the copy keeps every mount
// that existed when the spare started, and with it, say, a network
// namespace whose bind mount the host removed. So watchMounts retires an
// idle spare as soon as a mount it holds is gone from the host, and starts
// another. What it holds is read from the spare's own mount table, not
// guessed from the host's around its start: a pod's mounts made while the
// spare was starting (its netns bind, say) are not in the copy, and their
// removal must not cost a spare.

// takeSpare returns the warm spare stage-init, if any.
func (r *Runtime) takeSpare() *launched {
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	p := r.spare
	r.spare = nil
	return p
}

// spareIdleDelay is how long kurmad must have had no pod operation in
// flight before it makes the next spare. Making one costs a process or
// three and their Go start-up, and on a small machine the page faults of
// those slow down the pod start they would overlap as much as the spare
// then saves; made while idle, it costs no start anything.
const spareIdleDelay = 50 * time.Millisecond

// busy marks a pod operation (create, stop, remove, the end of a pod) in
// flight; the returned func ends it. When the last one ends, the next
// spare is scheduled.
func (r *Runtime) busy() (done func()) {
	r.spareMu.Lock()
	r.ops++
	r.spareMu.Unlock()
	return func() {
		r.spareMu.Lock()
		r.ops--
		idle := r.ops == 0
		r.spareMu.Unlock()
		if idle {
			r.scheduleRefill()
		}
	}
}

// scheduleRefill makes a spare after spareIdleDelay, unless a pod
// operation starts meanwhile (its end schedules again), one exists or is
// being made.
func (r *Runtime) scheduleRefill() {
	if r.opts.NoSpare {
		return
	}
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	if r.spare != nil || r.warm != nil || r.spareBusy {
		return
	}
	if r.idle != nil {
		r.idle.Stop()
	}
	r.idle = time.AfterFunc(spareIdleDelay, func() {
		r.spareMu.Lock()
		idle := r.ops == 0
		r.spareMu.Unlock()
		if idle {
			r.refillSpare()
		}
	})
}

// refillSpare starts making a spare in the background unless one exists
// or is being made: a pre-started stager when the default stager image
// allows it (prestart.go), a bare stage-init otherwise.
func (r *Runtime) refillSpare() {
	if r.opts.NoSpare || !r.startWork() {
		return
	}
	r.spareMu.Lock()
	if r.spare != nil || r.warm != nil || r.spareBusy {
		r.spareMu.Unlock()
		r.wg.Done()
		return
	}
	r.spareBusy = true
	r.spareMu.Unlock()
	go func() {
		defer r.wg.Done()
		w, err := r.makeWarm(r.closeCtx)
		if err == nil {
			r.spareMu.Lock()
			r.spareBusy = false
			keep := !r.isClosed() && r.warm == nil
			if keep {
				r.warm = w
			}
			r.spareMu.Unlock()
			if !keep {
				r.undoWarm(context.Background(), w)
			}
			return
		}
		if !errors.Is(err, errNoPrestart) {
			r.log.Warn("pre-start stager; keeping a bare stage-init instead", "err", err)
		}
		p, err := r.spawn(stageinit.SpareArg, nil, false)
		if err == nil {
			if p.mounts, err = mountKeys(strconv.Itoa(p.cmd.Process.Pid)); err != nil {
				p.abandon()
			}
		}
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

// dropSpare kills the unused spare and undoes an unused pre-started
// stager (on Close).
func (r *Runtime) dropSpare(ctx context.Context) {
	r.spareMu.Lock()
	p, w := r.spare, r.warm
	r.spare, r.warm = nil, nil
	if r.idle != nil {
		r.idle.Stop()
	}
	r.spareMu.Unlock()
	if p != nil {
		p.abandon()
	}
	if w != nil {
		r.undoWarm(ctx, w)
	}
}

// mountKey names a mount the same way in the host's table and in a copy
// of it (mount IDs differ between the two): device, root, mount point.
func mountKey(m mountInfo) string { return m.Dev + " " + m.Root + " " + m.Point }

// mountKeys counts the mounts of process pid ("self": this one) by
// mountKey.
func mountKeys(pid string) (map[string]int, error) {
	mis, err := readMountInfoOf(pid)
	if err != nil {
		return nil, err
	}
	keys := make(map[string]int, len(mis))
	for _, m := range mis {
		keys[mountKey(m)]++
	}
	return keys, nil
}

// staleSpare reports whether a spare holding the mounts held holds one
// the host (now) no longer has.
func staleSpare(held, now map[string]int) bool {
	for k, n := range held {
		if now[k] < n {
			return true
		}
	}
	return false
}

// watchMounts retires the idle spare when a host mount it may hold goes
// away (see the top of this file), until the Runtime closes. The kernel
// flags /proc/self/mountinfo with POLLPRI on every change of the mount
// table.
func (r *Runtime) watchMounts() {
	defer r.wg.Done()
	fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		r.log.Warn("watch mounts for the spare", "err", err)
		return
	}
	defer unix.Close(fd)
	// Closing the Runtime wakes the poll through this pipe.
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC); err != nil {
		r.log.Warn("watch mounts for the spare", "err", err)
		return
	}
	defer unix.Close(wake[0])
	var once sync.Once
	closeWake := func() { once.Do(func() { unix.Close(wake[1]) }) }
	defer closeWake()
	stop := context.AfterFunc(r.closeCtx, closeWake)
	defer stop()
	for r.closeCtx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}, {Fd: int32(wake[0]), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, -1)
		if err != nil && err != unix.EINTR {
			r.log.Warn("watch mounts for the spare", "err", err)
			return
		}
		if n <= 0 || fds[0].Revents&(unix.POLLPRI|unix.POLLERR) == 0 {
			continue
		}
		r.spareMu.Lock()
		p := r.spare
		r.spareMu.Unlock()
		if p == nil {
			continue
		}
		now, err := mountKeys("self")
		if err != nil || !staleSpare(p.mounts, now) {
			continue
		}
		r.spareMu.Lock()
		if r.spare != p {
			r.spareMu.Unlock()
			continue // taken meanwhile
		}
		r.spare = nil
		r.spareMu.Unlock()
		p.abandon()
		r.scheduleRefill()
	}
}
