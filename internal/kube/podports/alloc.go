package podports

import (
	"net/netip"

	"kurma.dev/kurma/pkg/kerrors"
)

// nextFree returns the first block of size bits inside pool that overlaps
// none of used. Pure; unit-tested.
func nextFree(pool netip.Prefix, bits int, used []netip.Prefix) (netip.Prefix, error) {
	pool = pool.Masked()
	if bits < pool.Bits() || bits > pool.Addr().BitLen() {
		return netip.Prefix{}, kerrors.New(kerrors.Invalid, "subnet size /%d does not fit pool %s", bits, pool)
	}
	p := netip.PrefixFrom(pool.Addr(), bits)
	for pool.Contains(p.Addr()) {
		clash := false
		for _, u := range used {
			if u.Overlaps(p) {
				clash = true
				break
			}
		}
		if !clash {
			return p, nil
		}
		next, ok := nextBlock(p)
		if !ok {
			break
		}
		p = next
	}
	return netip.Prefix{}, kerrors.New(kerrors.Exhausted, "no free /%d left in pool %s", bits, pool)
}

// nextBlock returns the block of the same size right after p.
func nextBlock(p netip.Prefix) (netip.Prefix, bool) {
	b := p.Addr().AsSlice()
	bit := p.Bits() - 1 // index of the block's lowest network bit
	for i := bit; i >= 0; i-- {
		byteI, mask := i/8, byte(0x80>>(i%8))
		if b[byteI]&mask == 0 {
			b[byteI] |= mask
			a, _ := netip.AddrFromSlice(b)
			return netip.PrefixFrom(a, p.Bits()), true
		}
		b[byteI] &^= mask
	}
	return netip.Prefix{}, false
}
