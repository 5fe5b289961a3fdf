// Package datapath owns the host agent's kernel state: the veth pair of each
// port (host end named after the port id, container end moved into the
// port's network namespace), one bridge and one VXLAN device per VPC, the
// static FDB and neighbour entries that point remote ports at their hosts,
// and one nftables table that isolates VPCs from each other.
//
// Everything here goes through vishvananda/netlink handles bound to a
// namespace (netlink.NewHandleAt) or runs inside ns.Do on a locked OS
// thread (sysctl writes, the nft binary); dumps go through the retry
// wrappers in nlsafe.go, and a test forbids the raw list calls elsewhere.
//
// Ownership is provable, so reconciliation never touches foreign objects:
// every link we create has a name derived from what it serves (prefix +
// "p" + hash of the port id, prefix + "b"/"v" + VNI) AND an alias that
// names the owner and the full id ("kurma-agent:port:<id>",
// "kurma-agent:vpc:<vni>"). A link counts as ours only when both match.
// FDB and neighbour entries are owned by living on our VXLAN device; nft
// rules live in our own table and carry an owner comment. The kernel
// ignores an alias in a link-creation request, so a crash can fall between
// creating a link and aliasing it; every link we create therefore gets, in
// the creation request itself, a signature MAC derived from owner, VTEP
// and name (sigMAC). A link with our prefix, no alias and its signature
// MAC is an interrupted creation of ours: Cleanup removes such links at
// start, EnsureVPC adopts such a bridge or VXLAN device. Bridges keep the
// signature MAC for life, so a gateway's MAC never changes and differs
// between hosts.
//
// Isolation: the kernel this runs on may lack VRF support (the CI kernel
// has none), so VPCs are isolated with nftables instead: the forward hook
// drops any packet that enters a VPC bridge and leaves through a different
// interface, or the reverse. Traffic inside one VPC (bridged, or routed
// between its subnets on the same bridge) passes; packets routed between
// two VPC bridges, or between a VPC and the host's other links, are
// dropped. ARP for the gateway (the same address on every host) is never
// flooded across hosts: the VXLAN device has no all-zero FDB entry, learns
// nothing, and answers ARP itself ("proxy") from the static neighbour
// entries of remote ports. VPCs may use overlapping CIDRs: pod-to-pod
// traffic inside a VPC is bridged, so it never meets the host's routing
// table (TestOverlappingVPCs); what stays ambiguous without VRFs is
// routing by the host itself (between two subnets of one VPC whose CIDR
// another VPC on the same host also uses).
//
// Addresses move: a released address goes to the next port at once (a
// subnet deleted and made again with the same CIDR starts again at its
// first address), on this host or another. The host's own neighbour
// entry for the address on the bridge (what it routes to it with: a
// load balancer's DNAT, the node's probes, another subnet's pods) still
// names the previous owner's MAC, and the kernel keeps using a confirmed
// entry for up to one and a half base_reachable_time (45 s by default)
// before it asks again. So Plug removes the host's entries for the
// port's addresses, and SetRemotes those of every remote address it
// adds, changes or removes: the host's next packet asks, and the new
// owner (or the proxy, for a remote one) answers.
//
// Port security (SetGuards): a bridge-family table of the same name as the
// inet one holds a prerouting chain of five fixed rules over five sets
// keyed by the host-side veth's name (guard.go): frames a guarded port
// sends must have its source MAC and be IPv4, ARP or IPv6; IPv4 and ARP
// senders must be one of its addresses (ARP may also use 0.0.0.0), IPv6
// sources one of its addresses, link-local or ::. Everything else the pod
// sends is dropped before the bridge sees it. A port's guard is its
// elements: the first SetGuards writes the table whole in one nft
// transaction, later ones write only the changed elements through netlink
// (no nft process, O(changed), one transaction). Elements match interface
// names, so a guard can precede its port's plug; a port plugged before its
// guard is set sends unguarded for that moment.
//
// Plug and the RTNL lock: every rtnetlink request that changes something
// takes the kernel's RTNL lock, which a burst of pod sandboxes (their
// namespaces, loopbacks and pairs) contends for. A fresh plug of a port
// with one address sends 7 requests (TestPlugNetlinkRequests counts
// them): the pair made on its bridge in one (the bridge's index kept from
// EnsureVPC; the kernel's echo gives the container end's index), the host
// end's alias with its bridge port's hairpin mode in one more (the
// creation cannot carry bridge port settings) and the removal of the
// host's neighbour entry for the address (one per address), on a socket
// of the plug's own, then the container end's alias, address, up and
// default route in the pod's namespace. The container end is made in the
// pod's namespace, never moved there: a move holds the RTNL lock across
// RCU grace periods (bench/README.md, stop 34: pairs made ahead of time
// and moved at the plug made a burst's plugs slower).
//
// Locking: a Datapath holds no mutable state besides its netlink handle
// (safe for concurrent use), the bridges' indexes (a sync.Map), the guard
// elements it wrote, and a mutex that serialises nft
// transactions and guards that record (nftMu). Callers serialise operations on the same port id and on the
// same VPC; different ports may be plugged concurrently.
//
// It speaks only in its own PortSpec/VPCSpec types, never in the
// controller's. Must not import: `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/pkg/controllerapi`.
package datapath
