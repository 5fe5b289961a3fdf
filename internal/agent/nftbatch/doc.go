// Package nftbatch writes element changes of nftables sets through one
// netlink connection, as the agent's datapaths (lbpath, policypath) do:
// deletions first (a replaced element is deleted, then added), each run
// of one set in messages of at most MsgElems elements, one transaction
// per TxOps operations (only a cold sync is larger). It knows nothing of
// what the elements mean. Must not import: `kurma.dev/kurma/internal/agent`, `kurma.dev/kurma/internal/agent/lbpath`, `kurma.dev/kurma/internal/agent/policypath`, `kurma.dev/kurma/internal/kube/...`, `kurma.dev/kurma/internal/controller/...`.
package nftbatch
