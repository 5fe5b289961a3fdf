// Package lbpath is the agent's load-balancer and floating-IP datapath:
// one nftables table (inet family, default "kurma-lb") whose cost lies in
// map elements, not in chains, so that a change touches only the elements
// it changes and a cold start loads tens of thousands of load balancers
// in seconds.
//
// Layout (`nft list table inet kurma-lb` shows all of it):
//   - services, a verdict map keyed by iifname . VIP . protocol . port:
//     one element per listener and frontend, pointing at a shared chain
//     pick-N (or pick-N-aff-S with affinity) that sets the packet mark to
//     a member index, or at chain "empty" that rejects (TCP reset, ICMP
//     port unreachable) when a load balancer has no members. The base
//     chain select-member looks this map up for new connections, at
//     priority dstnat - 10.
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
//   - forward: when AcceptMark is set, DNATed and SNATed flows and a FIP
//     port's egress get that bit in their packet mark, which the VPC
//     isolation rules of the datapath package let through.
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
// Every Apply is one netlink transaction (plus, only when a member count
// first appears or last disappears, one nft -f transaction for its pick
// chain); it touches only the elements whose wanted value differs from
// the mirror of the kernel. Sync reads every element, pick chain and FIP
// route back from the kernel, and adds, replaces or removes what differs:
// after a restart or kill -9 the table equals the given state.
//
// Locking: Path.mu guards all mirrors and serialises transactions.
//
// This package must not import the controller (internal/controller/...),
// pkg/controllerapi or the agent's other packages: it speaks only in its
// own LB and FIP types.
package lbpath
