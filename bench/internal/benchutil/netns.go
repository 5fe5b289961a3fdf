package benchutil

import (
	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/testutil"
)

// NewNS creates a network namespace (bind-mounted under /run/netns) and
// returns it with the function that closes and removes it
// (testutil.CreateNetNS, the one home of the netns helpers).
func NewNS() (ns.NetNS, func(), error) {
	n, remove, err := testutil.CreateNetNS()
	if err != nil {
		return nil, nil, err
	}
	return n, func() { _ = remove() }, nil
}
