// Package stager is Kurma's default stager, run as the static binary
// cmd/kurma-stager. It owns, inside the stager's root (see the stager spec
// and pkg/stagerspec):
//
//   - manifest.go: parsing /manifest and the run settings, and turning each
//     app into an AppPlan (exec, environment, identity, working directory);
//   - fs.go, copy.go: each app's root filesystem under /apps/<app>/rootfs, an
//     overlay of /layers/<id> (top-most first) with upper and work dirs on
//     the stager's own filesystem (on a tmpfs when that is itself an
//     overlay, as the daemon's is), or a copy honouring overlay-form
//     whiteouts; a minimal /dev with its own devpts (dev.go), /sys read-only
//     and the pod volumes bound into it;
//   - init.go: the pod init, PID 1 of the pod's PID namespace (hostname =
//     pod name). When the stager itself is PID 1 of a new PID namespace (as
//     kurmad starts it: stage-init is cloned with CLONE_NEWPID), init runs
//     inside the stager process, on one end of an in-process socket pair;
//     otherwise the stager re-executes itself as init in new
//     PID/IPC/UTS/mount namespaces. Init mounts the pod's /proc into every app,
//     starts each app in its own mount namespace chrooted into its rootfs,
//     reaps every process, logs app output to /logs/<app>, records
//     /state.json, and serves the call-ins on a SEQPACKET socket at
//     /run/kurma-stager/init.sock, passing descriptors with SCM_RIGHTS;
//   - callins.go: the /opt/stager/{status,logs,run,attach} clients, which the
//     daemon runs in the stager's mount and network namespaces but in its own
//     PID namespace, and which therefore ask init to act for them;
//   - stager.go: the stager main: build, start init, close fd 4 once every
//     app started, stop the pod on SIGTERM (TERM, grace, KILL), tear down.
//
// Lifetime: when all apps have exited the stager stays up and status shows
// every app exited; the daemon decides what to do with the pod. If init
// dies on its own the stager tears down and exits non-zero.
//
// Configuration (stagerConfig): {"union": "overlay"|"copy" (alias "fs"),
// "gracePeriod": "10s", "logMaxBytes": 10485760}. Unknown keys are
// ignored; bad values fail the pod at start (Invalid).
//
// Terminals: the pod manager sets the appc annotation kurma.dev/tty="true"
// (TTYAnnotation) on a RuntimeApp when the user asked for a tty; such an
// app gets a terminal of its own devpts instance as stdin, stdout and
// stderr instead of pipes, and attach talks to that terminal (raw, its
// size following the caller's terminal). kurma.dev/tty-size="ROWSxCOLS"
// (TTYSizeAnnotation) sets the terminal's size before the app starts.
//
// Call-in exit codes: status, logs and attach exit 0, 1 on failure, 2 on
// bad usage. The run call-in exits 127 when the command does not exist and
// 126 when it cannot be executed (as shells do; the stager role, too, exits
// with these when an app's command cannot start), 125 when it fails itself
// (bad settings, unknown app or user, settings not on fd 3 within 10 s,
// overridable for tests by KURMA_STAGER_SETTINGS_TIMEOUT), otherwise with
// the command's exit code (128+signal when killed). Attach ends when all
// of the app's output ended or the caller stops reading; the caller's EOF
// on stdin detaches input without closing the app's stdin, unless the
// caller passed -close-stdin (CloseStdinFlag): then init hands it its own
// end of the app's stdin and that EOF closes it (a terminal gets ^D).
//
// Least privilege (caps.go): apps share the pod PID namespace with init,
// whose root is the stager's root. Every app process and run call-in
// process therefore starts with a bounded capability set (DefaultCaps, the
// Docker/containerd default; widened or narrowed by the app's isolators
// os/linux/capabilities-retain-set and -remove-set), no ambient
// capabilities, and no_new_privs (unless os/linux/no-new-privileges is
// false); and init is not dumpable. An app, even as root, thus cannot
// open /proc/1/root, /proc/1/cwd or /proc/1/fd, so it can reach neither
// the stager's files nor the init socket. The bounding set is cut once on
// a locked OS thread per distinct set of privileges, which init keeps for
// its life and never runs anything else on (caps.go, spawner).
//
// Logs (applog.go): /logs/<app> is rotated to /logs/<app>.1 when it would
// pass logMaxBytes (one old generation is kept, so an app's logs take at
// most twice that). The logs call-in prints the old generation then the
// current one; logs -f follows the file across rotations (it checks when
// inotify reports a write under /logs or a new /state.json, at least every
// 500 ms, every 100 ms without inotify, and catches up with one rotation
// per check).
//
// Start-up and teardown costs: as PID 1 the stager starts no process but
// the apps. Otherwise init is the only re-exec, and it starts
// before the apps' filesystems are built so that its start-up overlaps
// that work (AppsDir is a shared bind mount, so what the stager mounts
// there afterwards reaches init's copy of the mount namespace); apps are started
// straight from init by fork+exec; init answers readiness before it writes
// /state.json, which is written without fsync (it is a cache for status
// when init is gone, rebuilt on every change, and lives no longer than the
// pod) and only when it changed; shutdown waits for the reaper's
// notifications, never on a timer; app overlays are mounted volatile (the
// upper dir dies with the pod, so unmounting does not sync it) and are
// unmounted deepest first with plain, not lazy, unmounts (a lazy unmount
// may wait for an RCU grace period). The call-in binary keeps its package
// inits small (no net/http, regexps compiled on first use).
//
// Go processes are multithreaded, so nothing here calls setns or unshare
// on a running process: new namespaces come from clone flags of fresh
// children (init via exec.Cmd, apps and run processes via syscall.ForkExec
// with Cloneflags and Chroot). Init never uses exec.Cmd.Wait: its reaper
// owns wait4(-1) and dispatches by pid.
//
// Locking: initServer.mu guards the app table, the pid waiters and the
// stopping flag; appProc.outMu guards an app's attached output streams;
// initServer.stateMu serialises writes of /state.json; appLog.mu guards an
// app log's file and size. No lock is held
// while a process is waited for or a client is written to, except the
// one-second bounded write of fanOut under outMu.
//
// It needs no cgo, and takes from Kurma only pkg/appc, pkg/stagerspec,
// mountinfo and kerrors.
// Must not import: `kurma.dev/kurma/...` (except `kurma.dev/kurma/pkg/appc`,
// `kurma.dev/kurma/pkg/stagerspec`, `kurma.dev/kurma/internal/mountinfo`,
// `kurma.dev/kurma/pkg/kerrors`).
package stager
