package benchutil

import (
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// NewNS creates a network namespace (bind-mounted under /run/netns) and
// returns it with the function that closes and unmounts it.
func NewNS() (ns.NetNS, func(), error) {
	n, err := testutils.NewNS()
	if err != nil {
		return nil, nil, err
	}
	return n, func() { _ = n.Close(); _ = testutils.UnmountNS(n) }, nil
}
