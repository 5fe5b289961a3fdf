// Package nfthost is the one owner of the agent's nftables setup in the
// host's network namespace: the packet and connection marks that its
// datapaths (datapath's VPC isolation and port guards, lbpath, policypath)
// pass to one another, the tables they write (by name and family), the
// lasting netlink connection each opens to write set elements (with
// buffers large enough for a cold sync in one sendmsg), the nft
// interface for their skeleton transactions, the two generations of data
// sets that a rebuild switches between atomically (Generations, lbpath's
// load balancers), and the ElementWriter those element writes go
// through, which Recorder fakes so that tests count a datapath's
// operations without root.
//
// Each datapath opens its own Conn: a netlink connection batches every
// message queued on it into the next Flush, so two writers must never
// share one.
//
// Must not import: `kurma.dev/kurma/internal/agent`, `kurma.dev/kurma/internal/agent/datapath`,
// `kurma.dev/kurma/internal/agent/lbpath`, `kurma.dev/kurma/internal/agent/policypath`,
// `kurma.dev/kurma/internal/kube/...`, `kurma.dev/kurma/internal/controller/...`.
package nfthost
