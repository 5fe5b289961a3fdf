// Package manager is kurmad's network manager: it attaches pods to their
// networks by calling each network's plugin (/opt/network/add and del, the
// network's config on stdin, NETNS_PATH POD_UUID IFNAME as arguments),
// implements pod.Networker, tracks each network's state (starting, running,
// failed) for `kurma net ls`, and supervises the networking pod that hosts
// one plugin container per network, restarting it with backoff.
//
// Files: manager.go (Options, New, states, List), attach.go (Attach, Detach,
// rollback, results into pod metadata and resolv.conf), caller.go (the Caller
// seam: PodCaller runs calls through the pod manager's run call-in in the
// networking pod; HostCaller runs plugin executables from host folders, used
// by tests, the benchmark and host mode), hostmode.go (host mode: plugin
// images pulled, checked for kurma.dev/host-privileged and run from their
// extracted root), hostmain.go (a plugin's main executable supervised as a
// host process), netpod.go (the networking pod supervisor, pod mode),
// netnsdir.go (the shared netns folder and the per-pod references).
//
// Locking: Manager.mu guards states and podLocks and is never held across a
// plugin call. Calls for one pod are serialised by that pod's podLock (taken
// by Attach and Detach); calls for different pods run concurrently.
//
// Every plugin call runs under its own timeout (Options.CallTimeout, 60 s by
// default); rollback and teardown run on a detached context so a cancelled
// request still removes what it added.
//
// DNS: the DNS sections of the add results are merged into
// <pod dir>/resolv.conf (the pod dir is the folder of Pod.NetNS) and into
// the stager root's writable layer as /etc/resolv.conf, which the stager
// copies into each app when it starts them.
//
// Must not import: `kurma.dev/kurma/internal/api`,
// `kurma.dev/kurma/internal/cli`, `kurma.dev/kurma/internal/config`. It imports the
// pod manager's types for pod.Networker and pod.Manager, and the stager
// package only for its init-socket client: stager.RunAt, the PodCaller's
// shortcut past nsenter and /opt/stager/run (a process start less per call;
// bench/netattach -mode pod shows the difference), and stager.StatusAt, the
// Supervisor's once-a-second poll without a process start.
//
// Pod mode (the default): the Supervisor keeps the networking pod
// (kurma-networking) running: host net/IPC/UTS, one app per network with
// the config on stdin and host privilege when the image declares it, the
// netns folder (Options.NetNSDir, PrepareNetNSDir) mounted at the same path
// with slave propagation and a persistent state folder per network. Attach
// binds each pod's namespace under NetNSDir (netnsdir.go) and Detach
// removes it after the last del.
package manager
