// Package pod is the pod manager of kurmad: it turns a Spec into a running
// pod by a table of steps with rollback (resolve images, make directories,
// write the stager manifest, launch the stager in its namespaces, wait for
// readiness), keeps each pod's record on disk so a restarted daemon re-adopts
// its pods, and drives the stager call-ins.
//
// Files: runtime.go (Options, New, Close), create.go (the start steps and
// their undos), launch.go (the daemon side of the stager launch, exit
// handling, teardown), prestart.go (stager images that may be pre-started
// and the waiting stagers made from them), hostread.go (reads of the stager's logs and status cache from the
// pod's folder, without call-ins), state.go
// (records, restart recovery, pid re-adoption), cgroups.go (cgroups and
// mount helpers), stop.go (Get/List/Stop/Remove), callin.go (call-ins),
// spare.go (the warm spare stage-init). Stage-init itself, the first
// process of every pod that makes the stager's mounts, pivots into its
// root and execs it, is package internal/pod/stageinit, run as the
// binary cmd/kurma-stage-init (or `kurmad stage-init` where that binary is
// missing).
//
// Locking: Runtime.mu guards the pod map and every record; it is never held
// across I/O, waits or mounts. entry.op serialises a pod's teardown with its
// removal; cgMu serialises the making of shared cgroup parents; spareMu
// guards the warm spare. A pidfd is
// only used or closed under mu, so its number cannot be reused under a
// signal. Readiness, exit watching and pidfd polling run in goroutines that
// take mu only to update state.
//
// Stop first asks the stager for the apps' status and keeps it in the
// record (AppInfo.Status), since nothing can tell it once the stager is
// gone; apps still running then are recorded as ended with the pod.
//
// Stager processes: the stager is started by re-executing kurmad with the
// clone flags of its new namespaces (mount, UTS, IPC and, unless the pod uses
// host networking, network), because a multithreaded Go process cannot
// safely setns/unshare a mount namespace itself. It runs in its own session
// so it survives kurmad; a restarted kurmad re-adopts it after checking its
// start time, and watches it with a pidfd.
//
// Mount hygiene: stage-init makes its mount namespace rprivate, then
// pivot_root(2)s into the stager root (an overlay, or the copied root bound
// on itself) and detaches the old root (MNT_DETACH). The pod's namespace
// thus keeps no copy of the host's mount tree: it pins no host mount (a
// netns bind under /run/netns unmounted on the host is really released).
//
// Terminals: AppSpec.TTY becomes the annotation kurma.dev/tty="true" on the
// app's RuntimeApp, and AppSpec.TTYSize kurma.dev/tty-size="ROWSxCOLS"
// (docs/stager.md). IO.CloseStdin makes Attach pass -close-stdin to the
// attach call-in: the caller's EOF then closes the app's stdin.
//
// Stopped pods: Logs reads the log files the stager left in the pod's
// folder. Running pods: non-following Logs reads the same files directly,
// and Status answers from the stager's /state.json when it shows every app
// exited (final); WaitSettled waits for that by inotify. Each falls back
// to the call-in when the stager keeps no such files.
//
// Call-ins run through nsenter(1) from util-linux (--mount --net --root
// --wd), which enters the namespaces in a fresh single-threaded process:
// simpler and more robust than a second re-exec helper, and util-linux is in
// hack/apt-packages.txt already.
//
// Cgroups: one folder <hierarchy>/kurma/<uuid> per mounted hierarchy (cgroup
// v1 controllers and cgroup2), bound at the hierarchy's path inside the
// stager root. Teardown kills every process left in them.
//
// Start steps (create.go, table `steps`): images (stager trust: signature
// required from the store, no dependencies; app images resolved and leased),
// dirs, rootfs (folders for an overlay of the store's extracted stager
// rootfs: extracted once per stager image ID, shared read-only, written per
// pod into <pod>/stager.upper; stage-init mounts it inside the stager's
// mount namespace, so the host holds no mount of it; copied instead when
// overlayfs is unavailable), manifest (into the upper folder), cgroups,
// launch (stage-init runs in new mount, UTS, IPC, PID and, unless the pod
// has host networking, network namespaces; it is PID 1 of its PID
// namespace and the stager it execs stays so, so the default stager serves
// as the pod's init; a warm spare stage-init already in fresh namespaces gets the
// config and the log descriptor over its socket, see spare.go, or a fresh
// one is forked; pid placed in the cgroups, pidfd taken), netns (bind of
// /proc/<pid>/ns/net at <pod>/netns), network (Options.Network), start
// (go-ahead on fd 3, a seqpacket socket; stage-init reports exec failures
// on close-on-exec fd 5), ready (EOF on fd 4, bounded by ReadyTimeout). A failure runs the undos
// of the steps done, including the failing one, in reverse, on a detached
// context. Options.FailStep is the failpoint the tests use.
//
// Records: <pods>/<uuid>/pod.json, written by temp file + rename. Only
// ended records (exited, errored: an exit status kept across a reboot)
// are fsynced, and not those of a pod being removed: a kurmad restart
// reads the others from the page cache, and a machine crash, which could
// lose them, ends their stagers too (a lost record leaves a folder that
// recovery removes as debris).
//
// Tests use a real but minimal stager (testdata/teststager, built at test
// time) for protocol and failure cases, and the real default stager
// (cmd/kurma-stager) with the real image store for end-to-end cases.
//
// Must not import: `kurma.dev/kurma/internal/api/...`,
// `kurma.dev/kurma/internal/cli`, `kurma.dev/kurma/internal/config`.
package pod
