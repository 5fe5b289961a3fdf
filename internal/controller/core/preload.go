package core

import (
	"context"
	"fmt"
	"sort"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Preload builds n ports in subnet sid of project pid exactly as the API
// stores them (port, MAC, host index, address bitmap) and hands them to
// load in sorted batches, bypassing the API; benchmarks use it to fill a
// store with a million ports quickly. Ports get status UP, the subnet's
// lowest free offsets, MACs 02:ff:.. derived from i, and host hostOf(i).
// The subnet must be empty.
func (s *Core) Preload(ctx context.Context, pid, sid string, n int, hostOf func(int) string, load func(context.Context, []store.KV) error) error {
	e, _, err := s.subnet(ctx, pid, sid)
	if err != nil {
		return err
	}
	if e.sub.Capacity() < int64(n) {
		return kerrors.New(kerrors.Exhausted, "subnet %s holds %d addresses, want %d", sid, e.sub.Capacity(), n)
	}
	ts := now()
	blocks := map[int][]byte{}
	const batch = 50000
	kvs := make([]store.KV, 0, 4*batch)
	flush := func() error {
		sort.Slice(kvs, func(i, j int) bool { return kvs[i].Key < kvs[j].Key })
		if err := load(ctx, kvs); err != nil {
			return err
		}
		kvs = kvs[:0]
		return nil
	}
	off := int64(0)
	for i := range n {
		for !e.sub.Allocatable(off) {
			off++
		}
		id := fmt.Sprintf("pre-%08d", i)
		p := capi.Port{
			ID: id, ProjectID: pid, Name: "k8s_" + id, NetworkID: sid, VethName: "eth0",
			NetworkNS: "/var/run/netns/" + id, VethNamespace: "/var/run/netns/" + id,
			BindingHostID: hostOf(i), BindingVNICType: "normal", Status: capi.StatusUp,
			MACAddress: fmt.Sprintf("02:ff:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i)),
			FixedIPs:   []capi.FixedIP{{SubnetID: sid, IPAddress: e.sub.Addr(off).String(), CIDR: e.wire.CIDR, GatewayIP: e.wire.GatewayIP}},
			VPCID:      e.vpc.ID, VNI: e.vpc.VNI, CreatedAt: ts, UpdatedAt: ts,
		}
		t := true
		p.AdminStateUp = &t
		pk := portKey(pid, id)
		kvs = append(kvs,
			store.KV{Key: pk, Value: mustJSON(p)},
			store.KV{Key: macKey(p.MACAddress), Value: []byte(pk)},
			store.KV{Key: hostIdxKey(p.BindingHostID, pid, id), Value: []byte{}},
			store.KV{Key: vpcIdxKey(pid, p.VPCID, id), Value: []byte{}},
		)
		blk, bit := ipam.Block(off)
		b := blocks[blk]
		if b == nil {
			b = make([]byte, ipam.BlockBytes)
			blocks[blk] = b
		}
		b[bit/8] |= 1 << uint(bit%8)
		off++
		if len(kvs) >= 4*batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	for blk, b := range blocks {
		kvs = append(kvs, store.KV{Key: blockKey(pid, sid, blk), Value: b})
	}
	if err := flush(); err != nil {
		return err
	}
	s.dropSubnet(subnetKey(pid, sid))
	return nil
}
