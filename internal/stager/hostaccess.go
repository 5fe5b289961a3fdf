package stager

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// podAnnotation returns the value of a pod annotation, "" if absent.
func podAnnotation(m appc.PodManifest, name string) string {
	for _, a := range m.Annotations {
		if a.Name == name {
			return a.Value
		}
	}
	return ""
}

func appAnnotation(ra appc.RuntimeApp, name string) string {
	for _, a := range ra.Annotations {
		if a.Name == name {
			return a.Value
		}
	}
	return ""
}

// appStdin decodes an app's stagerspec.StdinAnnotation (nil without one).
func appStdin(ra appc.RuntimeApp) ([]byte, error) {
	v := appAnnotation(ra, stagerspec.StdinAnnotation)
	if v == "" {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "app %q: annotation %s: %v", ra.Name, stagerspec.StdinAnnotation, err)
	}
	return b, nil
}

// initCloneFlags are the namespaces the pod init gets: new PID and mount
// namespaces always, new IPC and UTS unless the pod keeps the host's.
func initCloneFlags(m appc.PodManifest) uintptr {
	f := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS)
	if podAnnotation(m, stagerspec.HostIPCAnnotation) != "true" {
		f |= syscall.CLONE_NEWIPC
	}
	if podAnnotation(m, stagerspec.HostUTSAnnotation) != "true" {
		f |= syscall.CLONE_NEWUTS
	}
	return f
}

// podHostname is the hostname init sets: none when the pod shares the
// host's UTS namespace.
func podHostname(m appc.PodManifest, name string) string {
	if podAnnotation(m, stagerspec.HostUTSAnnotation) == "true" {
		return ""
	}
	return name
}

// readOnlyProcSys makes <rootfs>/proc/sys a read-only bind of itself, so
// that root in an app cannot change host-wide kernel settings
// (kernel.core_pattern and the like) through the pod's /proc.
func readOnlyProcSys(rootfs string) error {
	p := filepath.Join(rootfs, "proc", "sys")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind /proc/sys: %w", err)
	}
	if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make /proc/sys read-only: %w", err)
	}
	return nil
}

// feedStdin writes data to the app's stdin and then closes it (EOF), in the
// background: an app that never reads must not block init. Attach callers
// afterwards get a writer whose reader is gone.
func feedStdin(s *initServer, a *appProc, data []byte) {
	a.outMu.Lock()
	w := a.stdinW
	a.stdinW = nil
	a.outMu.Unlock()
	go func() {
		if _, err := w.Write(data); err != nil {
			s.log.Warn("write app stdin", "app", a.plan.Name, "err", err)
		}
		w.Close()
	}()
}
