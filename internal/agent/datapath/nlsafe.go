package datapath

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// dumpAttempts bounds the retries of a netlink dump the kernel interrupted
// (NLM_F_DUMP_INTR: the table changed while it was being read).
const dumpAttempts = 10

// retryDump runs a netlink dump until it completes without interruption.
// An interrupted dump may have returned a partial or inconsistent list, so
// it is never used.
func retryDump[T any](what string, f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range dumpAttempts {
		v, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			if err != nil {
				return v, fmt.Errorf("list %s: %w", what, err)
			}
			return v, nil
		}
	}
	var zero T
	return zero, fmt.Errorf("list %s: still interrupted after %d attempts: %w", what, dumpAttempts, err)
}

// The only places the package calls netlink's dump functions.

func linkList(h *netlink.Handle) ([]netlink.Link, error) {
	return retryDump("links", h.LinkList)
}

func addrList(h *netlink.Handle, l netlink.Link, family int) ([]netlink.Addr, error) {
	return retryDump("addresses", func() ([]netlink.Addr, error) { return h.AddrList(l, family) })
}

func routeList(h *netlink.Handle, l netlink.Link, family int) ([]netlink.Route, error) {
	return retryDump("routes", func() ([]netlink.Route, error) { return h.RouteList(l, family) })
}

func neighList(h *netlink.Handle, linkIndex, family int) ([]netlink.Neigh, error) {
	return retryDump("neighbours", func() ([]netlink.Neigh, error) { return h.NeighList(linkIndex, family) })
}
