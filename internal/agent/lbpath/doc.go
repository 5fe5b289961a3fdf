// Package lbpath is the agent's load-balancer and floating-IP datapath:
// one nftables table (inet family; the agent shares its isolation table)
// whose cost lies in
// map elements, not in chains, so that a change touches only the elements
// it changes and a cold start loads tens of thousands of load balancers
// in seconds.
//
// Layout (`nft list table inet <table>` shows all of it; names do not
// clash with the datapath package's chain "forward"):
//   - services, a map keyed by iifname . VIP . protocol . port: one
//     element per listener and frontend, giving a class (member count and
//     affinity timeout). The base chain select-member (priority
//     dstnat - 10) looks it up for new connections and jumps through the
//     small verdict map classes to a shared chain pick-N (pick-N-aff-S
//     with affinity) that sets the packet mark to a member index, or to
//     chain "empty" that rejects (TCP reset, ICMP port unreachable) when a
//     load balancer has no members. services holds data, not verdicts: a
//     verdict element makes the kernel revalidate every element of its
//     map at each commit.
//   - backends, a map keyed by the same tuple plus the member index,
//     giving member address . port; the nat-pre chain does one
//     `dnat ip to ... map @backends`.
//   - affinity, a dynamic map with timeouts: client . VIP . protocol .
//     port -> member index, filled from the packet path by the pick-N-aff
//     chains (source-IP affinity).
//   - hairpin, member . member: a member that reaches its own VIP is
//     masqueraded (to the bridge's gateway address), so the reply comes
//     back through the host. The bridge port must be in hairpin mode.
//   - fip-dnat, fip-snat, fip-ports, fip-addrs: a FIP is DNATed to its
//     port on the external interface, the port's egress through that
//     interface is SNATed to the FIP, and anything else sent to a FIP is
//     rejected. A FIP of a load balancer is one more frontend (external
//     interface . FIP) in services and backends. The host answers ARP for
//     its FIPs through a local route per FIP on the external interface,
//     tagged with a route protocol number of ours.
//   - external, external-backends: the same for external addresses
//     (address . protocol . port, on any interface); nodeports,
//     nodeport-backends: node ports (protocol . port) on the addresses of
//     the static set node-addrs. select-member tries the interface-keyed
//     services map, then external, then nodeports; nat-pre does the
//     matching DNAT. select-out and nat-out do the same for connections
//     the host opens (nft reads their iifname as empty, so a VIP with
//     host access is one more services element keyed by "").
//   - Members per frontend: each listener of each frontend selects its
//     own members (those serving the listener; only local ones for the
//     external frontends under ExternalLocal and the internal ones under
//     InternalLocal; backups only when no other is left), so a class and
//     a backend list per (frontend, listener).
//   - snat-frontends, snat-nodeports: external frontends whose
//     connections nat-post source-NATs to the node address (so that a
//     member on another host replies through this one); select sets
//     CtMarkSNAT in the connection mark, where the frontend is still the
//     destination. It also marks what the host opens into a VPC bridge
//     from another source than the node address (the gateway address is
//     the same on every host).
//   - nat-post also masquerades what leaves a VPC bridge for another
//     interface: DNATed connections to members outside the VPC, and with
//     Egress everything pods send out.
//   - filter-fwd: when AcceptMark is set, NATed connections (ct status
//     dnat or snat: FIPs, external frontends, members outside the VPC,
//     the runtime's host ports) and with Egress what pods send out get
//     that bit in their packet mark, which the VPC isolation rules of the
//     datapath package let through. Load balancer flows between pods of
//     one VPC stay on its bridge and need no exemption.
//   - UDP flows that a member change leaves stale (to a member that
//     left, or to a frontend that just got its first members) are deleted
//     from conntrack after the transaction (conntrack.go), as kube-proxy
//     does; New sets conntrack's CLOSE_WAIT timeout when asked
//     (Config.ConntrackCloseWait, kube-proxy's 1 h in Kubernetes mode),
//     since the kernel's 60 s drops the NAT of half-closed connections.
//   - ServiceRoutes: a route through lo per range of VIPs the host must
//     reach without a covering route; the output DNAT then re-routes.
//
// The key of services includes the ingress interface (the VPC's bridge),
// so a VIP answers only inside its VPC and VPCs may reuse addresses.
//
// Why this layout: the kernel's cost for a transaction grows with the
// number of chains in the table (validation walks them), so a chain per
// load balancer, as kube-proxy writes, makes cold syncs and single changes
// slow at tens of thousands. Elements of a hashed map cost nearly nothing
// per change. The member count selects one of a few shared chains because
// numgen needs a constant modulus.
//
// Why two writers: the skeleton and the pick chains are written with
// knftables through `nft -f`, so every rule is compiled by nft and reads
// back with `nft list ruleset`; elements, the part that changes, are
// written and read back with google/nftables over netlink (no process per
// change, no nft cache load of the whole table). Element types are
// declared by nft, so nft prints them too. bench/README.md has the
// measurements behind both choices.
//
// Restarts change nothing that is in place: Sync of up to 10,000
// elements (inPlaceMax; a restarted agent's usual case) reads the sets
// back and changes only the elements that differ, and the skeleton's
// chains are rewritten only when their rules differ (the last rule of
// each carries a fingerprint of the chain's rules as its comment, read
// back through netlink). So an agent restart removes no rule, set or
// element, not even for an atomic moment.
//
// Above that size the data sets exist in two generations (services-a,
// services-b, ...; nfthost.Generations names them and runs the switch):
// Sync fills the unused generation from scratch over netlink, then one
// nft transaction points the base chains at it and deletes the other:
// traffic sees the old state or the new one, never a mix, and nothing
// stale survives. Reading tens of thousands of elements
// back (or letting nft load them, which `nft -f` and `nft list` do)
// costs the kernel seconds; writing them costs less than one. Chains and
// sets are listed through netlink for the same reason.
//
// Every Apply is one netlink transaction (plus, only when a member count
// first appears or last disappears, one nft -f transaction for its pick
// chain); it touches only the elements whose wanted value differs from
// its record of the kernel's state (each element's slot keeps both what is
// wanted and what the kernel holds). Sync rebuilds the elements as above and reads
// pick chains and local routes back, adding and removing what differs:
// after a restart or kill -9 the table equals the given state.
//
// Check lists the table's chains and sets (cheap, no element read) and
// reports ErrDrift when something this Path wrote is gone (the table
// deleted or flushed by someone else); the agent runs it at every resync
// and then calls Sync.
//
// Files by verb: path.go (New, Close, configuration), skeleton.go (the
// base chains and their rules), apply.go (Apply, element ownership,
// commit), sync.go (Sync, reading the kernel back, Check), routes.go,
// conntrack.go, elements.go (keys and values of every set).
//
// Locking: Path.mu guards the wanted and kernel state (elements, pick
// chains, routes) and serialises transactions.
//
// It speaks only in its own LB and FIP types, never in the controller's or
// the agent's. Must not import: `kurma.dev/kurma/internal/controller/...`, `kurma.dev/kurma/pkg/controllerapi`, `kurma.dev/kurma/internal/agent`, `kurma.dev/kurma/internal/agent/datapath`.
package lbpath
