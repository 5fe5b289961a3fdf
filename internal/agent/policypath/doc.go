// Package policypath is the agent's NetworkPolicy datapath: sets and
// chains in the agent's nftables inet table (shared with the VPC
// isolation and the load balancers) that filter forwarded traffic to and
// from the node's own pods.
//
// Layout (`nft list table inet <table>` shows it; every name starts with
// "pol-"):
//   - pol-fwd, a base chain on the forward hook (priority filter + 5, so
//     after the load balancers' prerouting DNAT: policy sees the member's
//     address, never a VIP): established and related packets are
//     accepted (replies of allowed connections pass through conntrack);
//     a packet to a pod in pol-in-iso jumps to pol-in, one from a pod in
//     pol-eg-iso to pol-eg.
//   - pol-in and pol-eg look the packet up in five sets each and return
//     on the first hit, else drop:
//     exact (pod . peer . protocol . port, hashed), peer (pod . peer:
//     every protocol and port, hashed), port (pod . protocol . port: any
//     peer, hashed), range (pod . peer range . protocol . port range,
//     an interval set) and cidr (pod . peer range, interval).
//     "pod" is the local pod's address (the destination for pol-in, the
//     source for pol-eg), "peer" the other end.
//
// Why this layout: the selectors' result (pods and ports) is exact, so it
// lives in hashed sets whose elements cost O(1) to add or delete; only
// ipBlock and endPort need intervals, and nftables' concatenated interval
// sets (pipapo) cost O(set size) per change, so they hold only those.
// No chain per policy or per pod: a change is a netlink transaction of
// the elements it changes. The pipapo sets refuse elements that partly
// overlap, so each pod's ranges are first made disjoint (disjoint.go).
//
// Pod-to-pod traffic on one bridge is seen by the inet forward hook
// because the kernel's bridge netfilter (net.bridge.bridge-nf-call-iptables,
// which New turns on; without br_netfilter it warns, and same-bridge
// traffic is not filtered) passes bridged IPv4 through it; routed traffic
// (clusterIP after DNAT, other subnets, the outside) passes it anyway.
// Traffic the node itself sends or receives (kubelet probes, host network
// pods) uses the output and input hooks and is not filtered: the node's
// traffic to and from its pods is always allowed.
//
// Apply takes the wanted rules of the pods that changed and commits, in
// one netlink transaction, only the elements whose wanted state changed
// (each owner's references are counted; the path remembers, for the
// elements touched since the last commit, whether the kernel held them),
// encoded as the full sync's is (fulltx.go) into a buffer the Path keeps
// and sent on a netlink connection it keeps: a change allocates nothing
// per element. Pods handed the same old and new lists (replicas, which
// the engine gives one list) are walked once per Apply. A list that is
// its old one's Base with a new overlay (policyrule.Dir: the engine's
// patch of a few allows) is diffed by the two overlays alone: a change
// allocates and compares O(change), not O(list).
// Sync makes the kernel equal to the whole wanted state whatever it held
// (after a restart or kill -9, or drift): the first one of a process
// flushes every policy set and adds every wanted element in one atomic
// transaction (encoded straight into one buffer, fulltx.go), O(elements) in the kernel with nothing read back (a dump
// of a hashed set is quadratic in its messages; Kernel reads the sets,
// for tests). A later one (the periodic resync) checks that the sets are
// the ones it wrote (table and set handles) and still hold a sample of
// their elements (a few single-element lookups), then writes only the
// difference from its mirror: nothing when nothing changed. Elements are
// fixed-size and pointer-free, so the maps of hundreds of thousands of
// them are not scanned by the garbage collector.
//
// Established connections survive a policy that now forbids them (only
// new connections are checked), as in kube-network-policies' default
// mode; docs/kubernetes.md says so.
//
// Locking: Path.mu guards the mirrors and serialises transactions.
//
// It speaks only in the Pod/Dir/Allow types of internal/policyrule, which
// the policy engine computes in too (so its lists arrive uncopied), and
// never modifies a list it is handed. Must not import: `kurma.dev/kurma/internal/kube/...`, `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/internal/agent`, `k8s.io/...`.
package policypath
