package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// The kernel frees a network namespace some time after its last user
// (the pod sandbox's bind mount, its processes) is gone: a worker of its
// own unregisters its devices and runs every subsystem's exit, taking the
// RTNL lock, which every netlink request that changes links, addresses
// or routes also takes. A round's teardown removes 100 sandboxes at once,
// so without a wait the next round's burst (both peers alike) could meet
// the kernel still freeing the previous round's namespaces.

// netnsAlive is how many network namespaces the kernel holds, live or
// being freed: the active objects of the net_namespace slab cache. It is
// an upper bound (a slab allocator may count a freed object held in a
// CPU's slab as active), so settle waits for it to stop falling.
func netnsAlive() (int, error) {
	f, err := os.Open("/proc/slabinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseSlabActive(f, "net_namespace")
}

// parseSlabActive returns the active objects of cache in a /proc/slabinfo
// text.
func parseSlabActive(r io.Reader, cache string) (int, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != cache {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			return 0, fmt.Errorf("slabinfo %s: %w", cache, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("slabinfo: no %s cache", cache)
}

// settled is what settle saw: the namespaces held when it began and
// ended, and how long it waited.
type settled struct {
	from, to int
	waited   time.Duration
	ok       bool // the count fell to base or stopped falling before the deadline
}

// settle waits until the kernel has freed the namespaces of the previous
// round: until netnsAlive is at most base (the count before the first
// round), or has not fallen for quiet, at most max in all. Other work on
// the machine makes and frees namespaces too, hence the second rule.
func settle(ctx context.Context, base int, quiet, max time.Duration) (settled, error) {
	start := time.Now()
	n, err := netnsAlive()
	if err != nil {
		return settled{}, err
	}
	s := settled{from: n, to: n}
	low, lowAt := n, start
	for {
		if n <= base || time.Since(lowAt) >= quiet {
			s.ok = true
			break
		}
		if time.Since(start) >= max {
			break
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if n, err = netnsAlive(); err != nil {
			return s, err
		}
		if n < low {
			low, lowAt = n, time.Now()
		}
		s.to = n
	}
	s.waited = time.Since(start)
	return s, nil
}

// loadAvg is the machine's 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}
