package ipam

import (
	"crypto/rand"
	"encoding/binary"
	"net"
	"sync/atomic"

	"kurma.dev/kurma/pkg/kerrors"
)

// RandomMAC returns a random locally administered unicast MAC address.
func RandomMAC() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	b[0] = (b[0] &^ 0x01) | 0x02
	return net.HardwareAddr(b).String()
}

// ParseMAC validates a caller-given MAC (48-bit unicast) and returns it in
// canonical lower-case form.
func ParseMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", kerrors.New(kerrors.Invalid, "mac_address %q: want a 48-bit MAC", s)
	}
	if hw[0]&0x01 != 0 {
		return "", kerrors.New(kerrors.Invalid, "mac_address %q is multicast", s)
	}
	if string(hw) == "\x00\x00\x00\x00\x00\x00" {
		return "", kerrors.New(kerrors.Invalid, "mac_address %q is all zeros", s)
	}
	return hw.String(), nil
}

// MaxVNI is the largest 24-bit VXLAN id.
const MaxVNI = 1<<24 - 1

// RandomVNI returns a VXLAN id in [1, MaxVNI].
func RandomVNI() uint32 {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	v := (uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])) % MaxVNI
	return v + 1
}

// MACGen hands out MACs that are locally administered unicast and
// sequential from a random start, so that consecutive ports' MAC keys sit
// next to each other in the store (cheap B+tree inserts). Uniqueness is
// still enforced by the store; on a clash call Next again. Safe for
// concurrent use.
type MACGen struct {
	next atomic.Uint64
}

// NewMACGen starts at a random point of the 46-bit space.
func NewMACGen() *MACGen {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	g := &MACGen{}
	g.next.Store(binary.BigEndian.Uint64(b))
	return g
}

// Next returns the next MAC.
func (g *MACGen) Next() string {
	v := g.next.Add(1)
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	hw := b[2:]
	hw[0] = (hw[0] &^ 0x01) | 0x02
	return net.HardwareAddr(hw).String()
}
