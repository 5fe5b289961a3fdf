// Package agent is the host agent's reconciler: it registers the host with
// the controller, watches the ports it needs and every host there
// (pkg/controllerapi), and drives the datapath so that this host's kernel state matches the
// controller's view: each port bound to this host is plugged and reported
// UP (or DOWN when its network namespace is gone, or ERROR with a reason
// when it cannot be plugged), each VPC with local ports has its bridge,
// VXLAN device and remote entries, and everything else the datapath owns
// is removed.
//
// Shape (sample-controller style): watch handlers only update the cache
// and enqueue keys ("p/<port id>", "v/<vni>"); workers drain a queue that
// never hands one key to two workers, sync by level from the cache, treat
// "not in the cache" as "remove", and requeue failures with exponential
// backoff. After each (re)list and periodically, an orphan scan enqueues
// every port and VPC the datapath owns, so a restart recreates what is
// missing and removes what is no longer wanted. A resync touches nothing
// of a port plugged as it is now (its namespace there, its spec and its
// VPC's bridge as at its last plug, less than Config.Replug ago: a pod
// burst's resync re-plugged every pod, 8 netlink requests each);
// a host end that vanishes is reported by the datapath's link events and
// plugged again at once. A replug of a port that is already plugged is a
// no-op in the datapath (no second link).
//
// Restarts leave the datapath as it is: the first load-balancer sync
// waits for the load balancer listing and VPC syncs wait for the host
// listing (either sync before them would remove what the cache has not
// seen yet, then add it back), on-link VIPs are decided from the cache
// rather than from the VPCs ensured so far, and the datapaths read their
// kernel state back and change only what differs. Readiness (Programmed)
// holds once the ports, hosts and load balancers are listed and the load
// balancers programmed.
//
// A VPC whose last local port leaves is kept for Config.VPCLinger (the
// binary's --vpc-linger, default 3s) before it is removed: CNI churn is
// DEL then ADD on the same network, and recreating the bridge, VXLAN
// device and nft rules made the next ADD much slower (figures in
// bench/README.md, "Figures behind design choices"). While it
// lingers its remote entries are not kept current; the next local port's
// plug queues a full VPC sync.
//
// Port watch scope: the agent watches with WatchHostPorts, so the
// controller sends only this host's ports and the ports of the VPCs this
// host has ports in (filtered server-side). When a port brings the host
// into a VPC, the controller follows its event with the VPC's other
// ports; when the host's last port in a VPC goes, the agent drops that
// VPC's remote ports from its cache at the same point of the stream where
// the controller stops sending them. Such a watch cannot resume from a
// revision, so every reconnect lists again (the list is this host's
// scope only). The host watch resumes from its last revision.
//
// Port security: every local port whose port_security_enabled is not
// false gets a datapath guard (anti-spoofing: its MAC and addresses only,
// plus single-address allowed_address_pairs on its own MAC). A port whose
// allowed pairs name another MAC or a CIDR is left unguarded, as is one
// with port security off. All guards are one queue key ("g/"), synced
// from the cache after the first list and on every resync. Security
// groups are stored by the controller but not enforced.
//
// Layout and locking: the agent's state is split by what it reconciles,
// each part with its own lock and queue keys (see Agent). Ports and VPCs:
// the port cache (cache.go: the controller's records, hosts, subnets)
// and the VPC state (vpc.go: gateways ensured, remotes programmed,
// linger, and one RWMutex per VPC: deleting the VPC takes it
// exclusively; plugging a port into the VPC, ensuring it and setting its
// remotes share it, and ensures (a plug's that finds the VPC not
// ensured, a sync's) take turns at a second, per-VPC mutex; a worker holds at most one
// VPC lock at a time). Attachments (attach.go):
// where the CNI daemon said ports go, and the callers waiting on them;
// the cache keeps the controller's records as sent, and a port's sync
// places it (Agent.place). Load balancers and floating IPs (lb.go): their
// cache and what was programmed, with a snapshot of the local ports and
// VPCs taken at each sync. No lock is held across a network or netlink
// call, and none is taken while another is held, but for three: a VPC lock
// is held across that VPC's datapath work (it orders it), a VPC's ensure
// lock is taken under its VPC lock, and the health
// checks' lock (healthcheck.go) is taken under the load balancers'. The ADD path reads top to bottom in
// port.go (syncPort). Datapath link events (a host end vanishing with its
// namespace) only enqueue keys.
//
// Imports: pkg/controllerapi and internal/agent/datapath; never the
// controller's server or store (internal/controller/...).
package agent
