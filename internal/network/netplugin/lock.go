package netplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// podLock is a held lock; release it exactly once.
type podLock struct {
	f    *os.File
	path string
}

// unlock releases the lock. With remove, the lock file is unlinked first
// (after a del, so files do not pile up); a waiter that opened the old file
// notices the unlink and retries on a fresh one.
func (l *podLock) unlock(remove bool) {
	if remove {
		_ = os.Remove(l.path)
	}
	_ = l.f.Close()
}

// lock takes the exclusive flock serialising calls for one (network, pod),
// across processes. It polls so that ctx can end the wait.
func (p *Plugin) lock(ctx context.Context, network, pod string) (*podLock, error) {
	path := filepath.Join(lockDir(p.stateDir), network+"_"+pod+".lock")
	for delay := time.Millisecond; ; delay = min(delay*2, 50*time.Millisecond) {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// The holder before us may have removed the file: only the
			// file currently at path counts.
			fi, err1 := f.Stat()
			pi, err2 := os.Stat(path)
			if err1 == nil && err2 == nil && os.SameFile(fi, pi) {
				return &podLock{f: f, path: path}, nil
			}
			_ = f.Close()
			continue
		}
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			return nil, kerrors.New(kerrors.Timeout, "waiting for the lock of pod %s on network %q: %v", pod, network, ctx.Err())
		case <-time.After(delay):
		}
	}
}
