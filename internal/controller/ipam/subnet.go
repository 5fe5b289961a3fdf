package ipam

import (
	"math/big"
	"net/netip"
	"sort"

	"kurma.dev/kurma/pkg/kerrors"
)

const (
	// BlockBits is how many addresses one persisted bitmap block covers.
	BlockBits = 4096
	// BlockBytes is the size of one block's bitmap.
	BlockBytes = BlockBits / 8
	// MaxAddresses caps the allocatable offsets of a subnet (IPv6 subnets
	// are larger; only their first 2^24 addresses are handed out).
	MaxAddresses = 1 << 24
)

// Pool is an inclusive address range.
type Pool struct{ Start, End string }

type span struct{ lo, hi int64 } // inclusive offsets

// Subnet is a parsed, validated subnet. Offsets count addresses from the
// network address.
type Subnet struct {
	prefix  netip.Prefix
	size    int64 // addresses usable as offsets (capped at MaxAddresses)
	full    bool  // size is the whole prefix (not capped)
	gateway netip.Addr
	gwOff   int64
	pools   []span // sorted, disjoint
}

// New parses cidr (which must be a network address: 10.0.0.0/24, not
// 10.0.0.5/24), ipVersion (0: derive), gateway ("" : first host address) and
// pools (none: every host address but the gateway).
func New(cidr string, ipVersion int, gateway string, pools []Pool) (*Subnet, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "cidr %q: %v", cidr, err)
	}
	if p.Masked() != p {
		return nil, kerrors.New(kerrors.Invalid, "cidr %q has host bits set (network is %s)", cidr, p.Masked())
	}
	v := 4
	if !p.Addr().Is4() {
		v = 6
	}
	if p.Addr().Is4In6() {
		return nil, kerrors.New(kerrors.Invalid, "cidr %q: IPv4-mapped IPv6 prefixes are not supported", cidr)
	}
	if ipVersion != 0 && ipVersion != v {
		return nil, kerrors.New(kerrors.Invalid, "cidr %q is IPv%d but ip_version is %d", cidr, v, ipVersion)
	}
	hostBits := p.Addr().BitLen() - p.Bits()
	s := &Subnet{prefix: p, gwOff: -1}
	if hostBits >= 24 {
		s.size = MaxAddresses
		s.full = hostBits == 24
	} else {
		s.size = 1 << hostBits
		s.full = true
	}
	// Host range: IPv4 excludes network and broadcast (except /31, /32);
	// IPv6 excludes the subnet-router anycast address (offset 0) unless /127+.
	lo, hi := int64(1), s.size-1
	if v == 4 && hostBits >= 2 && s.full {
		hi = s.size - 2
	}
	if hostBits < 2 {
		lo = 0
	}
	if lo > hi {
		return nil, kerrors.New(kerrors.Invalid, "cidr %q has no host addresses", cidr)
	}
	if gateway == "" {
		s.gwOff = lo
		s.gateway = s.Addr(lo)
	} else {
		g, err := netip.ParseAddr(gateway)
		if err != nil {
			return nil, kerrors.New(kerrors.Invalid, "gateway_ip %q: %v", gateway, err)
		}
		off, err := s.offset(g)
		if err != nil || off < lo || off > hi {
			return nil, kerrors.New(kerrors.Invalid, "gateway_ip %s is not a host address of %s", g, p)
		}
		s.gateway, s.gwOff = g, off
	}
	if len(pools) == 0 {
		s.pools = []span{{lo, hi}}
		return s, nil
	}
	for _, pl := range pools {
		a, err1 := netip.ParseAddr(pl.Start)
		b, err2 := netip.ParseAddr(pl.End)
		if err1 != nil || err2 != nil {
			return nil, kerrors.New(kerrors.Invalid, "allocation pool %s-%s: bad address", pl.Start, pl.End)
		}
		ao, err1 := s.offset(a)
		bo, err2 := s.offset(b)
		if err1 != nil || err2 != nil || ao < lo || bo > hi {
			return nil, kerrors.New(kerrors.Invalid, "allocation pool %s-%s is not within the host addresses of %s (first %d addresses for large IPv6 subnets)", a, b, p, MaxAddresses)
		}
		if ao > bo {
			return nil, kerrors.New(kerrors.Invalid, "allocation pool %s-%s: start after end", a, b)
		}
		s.pools = append(s.pools, span{ao, bo})
	}
	sort.Slice(s.pools, func(i, j int) bool { return s.pools[i].lo < s.pools[j].lo })
	for i := 1; i < len(s.pools); i++ {
		if s.pools[i].lo <= s.pools[i-1].hi {
			return nil, kerrors.New(kerrors.Invalid, "allocation pools overlap at %s", s.Addr(s.pools[i].lo))
		}
	}
	return s, nil
}

// Prefix returns the subnet's prefix.
func (s *Subnet) Prefix() netip.Prefix { return s.prefix }

// Gateway returns the gateway address.
func (s *Subnet) Gateway() netip.Addr { return s.gateway }

// Pools returns the allocation pools as address ranges.
func (s *Subnet) Pools() []Pool {
	out := make([]Pool, len(s.pools))
	for i, p := range s.pools {
		out[i] = Pool{s.Addr(p.lo).String(), s.Addr(p.hi).String()}
	}
	return out
}

// Capacity is the number of addresses the pools can hand out.
func (s *Subnet) Capacity() int64 {
	var n int64
	for _, p := range s.pools {
		n += p.hi - p.lo + 1
		if s.gwOff >= p.lo && s.gwOff <= p.hi {
			n--
		}
	}
	return n
}

// Blocks is the number of bitmap blocks covering every allocatable offset.
func (s *Subnet) Blocks() int {
	last := s.pools[len(s.pools)-1].hi
	return int(last/BlockBits) + 1
}

func (s *Subnet) offset(a netip.Addr) (int64, error) {
	if !s.prefix.Contains(a) {
		return 0, kerrors.New(kerrors.Invalid, "%s is not in %s", a, s.prefix)
	}
	base := new(big.Int).SetBytes(s.prefix.Addr().AsSlice())
	off := new(big.Int).Sub(new(big.Int).SetBytes(a.AsSlice()), base)
	if !off.IsInt64() || off.Int64() >= s.size {
		return 0, kerrors.New(kerrors.Invalid, "%s is beyond the first %d addresses of %s", a, MaxAddresses, s.prefix)
	}
	return off.Int64(), nil
}

// Addr returns the address at offset off.
func (s *Subnet) Addr(off int64) netip.Addr {
	b := s.prefix.Addr().AsSlice()
	carry := uint64(off)
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		sum := uint64(b[i]) + (carry & 0xff)
		b[i] = byte(sum)
		carry = (carry >> 8) + (sum >> 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Allocatable reports whether the controller may hand out offset off on
// its own: inside a pool and not the gateway.
func (s *Subnet) Allocatable(off int64) bool {
	if off == s.gwOff {
		return false
	}
	i := sort.Search(len(s.pools), func(i int) bool { return s.pools[i].hi >= off })
	return i < len(s.pools) && s.pools[i].lo <= off
}

// Request validates a caller-requested address and returns its offset.
// Addresses outside the pools are allowed (as in Neutron); the network and
// broadcast addresses are Invalid and the gateway is a Conflict.
func (s *Subnet) Request(addr string) (int64, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return 0, kerrors.New(kerrors.Invalid, "ip_address %q: %v", addr, err)
	}
	off, err := s.offset(a)
	if err != nil {
		return 0, err
	}
	if off == s.gwOff {
		return 0, kerrors.New(kerrors.Conflict, "%s is the gateway of %s", a, s.prefix)
	}
	hostBits := s.prefix.Addr().BitLen() - s.prefix.Bits()
	if hostBits >= 2 && (off == 0 || (s.prefix.Addr().Is4() && s.full && off == s.size-1)) {
		return 0, kerrors.New(kerrors.Invalid, "%s is the network or broadcast address of %s", a, s.prefix)
	}
	return off, nil
}

// Block splits an offset into block index and bit.
func Block(off int64) (block int, bit int) { return int(off / BlockBits), int(off % BlockBits) }
