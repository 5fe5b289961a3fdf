package pod

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/stagerspec"
)

// Host-side reads of what the default stager leaves in its root: its app
// logs (/logs/<app>, /logs/<app>.1) and its status cache (/state.json,
// {"apps": Status}, replaced by rename on every change). The root's writes
// land in the pod's folder (the overlay's upper folder, or the copied root),
// so the daemon can read them without a call-in, which costs an nsenter and
// a Go process start. Other stagers need not write these files: every
// reader falls back to the call-in when they are missing.

// stagerRootsOnHost are the folders that hold the stager root's writes.
func (r *Runtime) stagerRootsOnHost(uuid string) []string {
	dir := r.podDir(uuid)
	return []string{filepath.Join(dir, "stager.upper"), filepath.Join(dir, "stager")}
}

// openInRoot opens rel, a regular file below root, refusing symbolic
// links anywhere on the way (the stager writes these folders; the daemon
// must not be led out of them).
func openInRoot(root, rel string) (*os.File, error) {
	dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, rel))
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: f.Name(), Err: unix.EINVAL}
	}
	return f, nil
}

// copyHostLogs copies the older log generation, then the current one.
// It reports false when the stager left no log file for the app.
func (r *Runtime) copyHostLogs(p *Pod, app string, w io.Writer) (bool, error) {
	rel := filepath.Join("logs", filepath.Base(app))
	for _, root := range r.stagerRootsOnHost(p.UUID) {
		cur, err := openInRoot(root, rel)
		if err != nil {
			continue
		}
		defer cur.Close()
		if old, err := openInRoot(root, rel+".1"); err == nil {
			_, err = io.Copy(w, old)
			old.Close()
			if err != nil {
				return true, err
			}
		}
		_, err = io.Copy(w, cur)
		return true, err
	}
	return false, nil
}

// settledStatus returns the stager's status cache when it shows every app
// of p as exited: an exit is final, so such a status cannot be stale. ok is
// false otherwise (no cache, or an app still running as far as it knows).
func (r *Runtime) settledStatus(p *Pod) (st stagerspec.Status, ok bool) {
	for _, root := range r.stagerRootsOnHost(p.UUID) {
		f, err := openInRoot(root, "state.json")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(f, 1<<20))
		f.Close()
		if err != nil {
			return nil, false
		}
		var s struct {
			Apps stagerspec.Status `json:"apps"`
		}
		if json.Unmarshal(b, &s) != nil || len(s.Apps) == 0 {
			return nil, false
		}
		for _, a := range p.Apps {
			if as, found := s.Apps[a.Name]; !found || !as.Exited {
				return nil, false
			}
		}
		return s.Apps, true
	}
	return nil, false
}

// WaitSettled waits, at most within, until the stager's status cache shows
// every app of the pod exited, and returns that status. It is told of each
// rewrite of the cache by inotify, so it neither polls nor runs call-ins.
// ok is false when the time ran out, ctx ended, the pod is not running or
// its stager keeps no such cache (then ask Status). Unless the pod is not
// running, it returns no earlier than within, so callers may loop on it.
func (r *Runtime) WaitSettled(ctx context.Context, ref string, within time.Duration) (st stagerspec.Status, ok bool) {
	p, err := r.running(ref)
	if err != nil {
		return nil, false
	}
	if st, ok := r.settledStatus(p); ok {
		return st, true
	}
	deadline := time.Now().Add(within)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	if st, ok := r.watchSettled(p, deadline); ok {
		return st, true
	}
	// No watch possible, or the time ran out: wait out the rest.
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil, false
}

// watchSettled waits by inotify on the stager root's folder until
// settledStatus answers or deadline passes.
func (r *Runtime) watchSettled(p *Pod, deadline time.Time) (stagerspec.Status, bool) {
	var root string
	for _, d := range r.stagerRootsOnHost(p.UUID) {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			root = d
			break
		}
	}
	if root == "" {
		return nil, false
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	if _, err := unix.InotifyAddWatch(fd, root, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		return nil, false
	}
	buf := make([]byte, 4096)
	for {
		// Checked after the watch exists, so no rewrite is missed.
		if st, ok := r.settledStatus(p); ok {
			return st, true
		}
		if err := f.SetReadDeadline(deadline); err != nil {
			return nil, false
		}
		if _, err := f.Read(buf); err != nil {
			return nil, false // deadline (or a broken watch)
		}
	}
}
