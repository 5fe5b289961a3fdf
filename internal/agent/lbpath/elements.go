package lbpath

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"
)

// The sets and maps of the table, by index into setDefs.
const (
	setSvc      = iota // map: iifname . vip . proto . port -> class (member count, affinity)
	setBackend         // map: iifname . vip . proto . port . index -> member . port
	setHairpin         // set: member . member (a member reaching its own VIP)
	setFIPDNAT         // map: fip -> port address
	setFIPSNAT         // map: port address -> fip
	setFIPPorts        // set: port addresses with a fip (their egress may leave)
	setFIPAddrs        // set: every fip answered here
	numSets
	// setRoute is not an nft set: its "elements" are the local routes
	// (key: interface name, NUL, address) that make the host answer ARP
	// for a FIP on the external interface or an on-link VIP on its bridge.
	setRoute = numSets
)

type setDef struct {
	name   string
	isMap  bool
	vmap   bool
	decl   string // the nft type of key (and data)
	keyLen int
}

var setDefs = [numSets]setDef{
	setSvc:      {name: "services", isMap: true, keyLen: 28, decl: "ifname . ipv4_addr . inet_proto . inet_service : mark"},
	setBackend:  {name: "backends", isMap: true, keyLen: 32, decl: "ifname . ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service"},
	setHairpin:  {name: "hairpin", keyLen: 8, decl: "ipv4_addr . ipv4_addr"},
	setFIPDNAT:  {name: "fip-dnat", isMap: true, keyLen: 4, decl: "ipv4_addr : ipv4_addr"},
	setFIPSNAT:  {name: "fip-snat", isMap: true, keyLen: 4, decl: "ipv4_addr : ipv4_addr"},
	setFIPPorts: {name: "fip-ports", keyLen: 4, decl: "ipv4_addr"},
	setFIPAddrs: {name: "fip-addrs", keyLen: 4, decl: "ipv4_addr"},
}

// elem names one element: its set and its key bytes.
type elem struct {
	set uint8
	key string
}

// emptyChain rejects connections to a load balancer without members.
const emptyChain = "empty"

// pickChain names the shared chain that picks one of n members (with
// affinity for aff, rounded to whole seconds).
func pickChain(n int, aff time.Duration) string {
	if n == 0 {
		return emptyChain
	}
	s := "pick-" + strconv.Itoa(n)
	if aff > 0 {
		s += "-aff-" + strconv.FormatInt(int64(affSeconds(aff)), 10)
	}
	return s
}

func affSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// A class names what a services element leads to: the member count in the
// low 11 bits, the affinity timeout in seconds above them; 0 (no members)
// is the empty chain. The classes verdict map sends each class in use to
// its pick chain, so that services holds plain data: adding a verdict
// element makes the kernel validate every element of its map at commit,
// O(load balancers) per change.
const classBits = 11

func classOf(n int, aff time.Duration) uint32 {
	if n == 0 {
		return 0
	}
	c := uint32(n)
	if aff > 0 {
		c |= uint32(affSeconds(aff)) << classBits
	}
	return c
}

// chainOfClass is the pick chain of class c.
func chainOfClass(c uint32) string {
	return pickChain(int(c&(1<<classBits-1)), time.Duration(c>>classBits)*time.Second)
}

// Key encodings follow nft's: every field of a concatenation is padded to
// 4 bytes; addresses and ports are big-endian, the mark host-endian.
func putIfname(b []byte, name string) []byte {
	var f [16]byte
	copy(f[:], name)
	return append(b, f[:]...)
}

func putAddr(b []byte, a netip.Addr) []byte {
	v := a.As4()
	return append(b, v[:]...)
}

func putProto(b []byte, p uint8) []byte { return append(b, p, 0, 0, 0) }

func putPort(b []byte, p uint16) []byte { return append(b, byte(p>>8), byte(p), 0, 0) }

func putMark(b []byte, m uint32) []byte { return binary.NativeEndian.AppendUint32(b, m) }

func svcKey(iface string, vip netip.Addr, proto uint8, port uint16) []byte {
	b := make([]byte, 0, 32)
	return putPort(putProto(putAddr(putIfname(b, iface), vip), proto), port)
}

// frontend is one address a load balancer answers on, and where.
type frontend struct {
	iface string
	addr  netip.Addr
}

// lbElems returns the elements an LB owns for the given frontends.
func lbElems(l *LB, fronts []frontend, add func(e elem, val string)) {
	verdict := string(putMark(nil, classOf(len(l.Members), l.Affinity)))
	for _, f := range fronts {
		for _, ls := range l.Listeners {
			k := svcKey(f.iface, f.addr, ls.Proto, ls.Port)
			add(elem{setSvc, string(k)}, verdict)
			target := ls.TargetPort
			if target == 0 {
				target = ls.Port
			}
			for i, m := range l.Members {
				bk := putMark(append([]byte(nil), k...), uint32(i))
				port := m.Port
				if port == 0 {
					port = target
				}
				add(elem{setBackend, string(bk)}, string(putPort(putAddr(nil, m.Addr), port)))
			}
		}
	}
	if l.OnLink {
		add(routeElem(l.Iface, l.VIP), "")
	}
	for _, m := range l.Members {
		add(elem{setHairpin, string(putAddr(putAddr(nil, m.Addr), m.Addr))}, "")
	}
}

// fipElems returns the elements a FIP owns itself (a FIP of a load
// balancer adds a frontend to it instead).
func fipElems(f *FIP, ext string, add func(e elem, val string)) {
	fa := string(putAddr(nil, f.Addr))
	add(elem{setFIPAddrs, fa}, "")
	add(routeElem(ext, f.Addr), "")
	if f.PortAddr.IsValid() {
		pa := string(putAddr(nil, f.PortAddr))
		add(elem{setFIPDNAT, fa}, pa)
		add(elem{setFIPSNAT, pa}, fa)
		add(elem{setFIPPorts, pa}, "")
	}
}

func routeElem(iface string, a netip.Addr) elem {
	return elem{setRoute, iface + "\x00" + string(putAddr(nil, a))}
}

// routeOf splits a route element's key.
func routeOf(e elem) (iface string, a netip.Addr) {
	i := len(e.key) - 5
	return e.key[:i], netip.AddrFrom4([4]byte([]byte(e.key[i+1:])))
}
