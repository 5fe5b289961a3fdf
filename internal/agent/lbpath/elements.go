package lbpath

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"
)

// The sets and maps of the table, by index into setDefs.
const (
	setSvc        = iota // map: iifname . vip . proto . port -> class (member count, affinity)
	setBackend           // map: iifname . vip . proto . port . index -> member . port
	setHairpin           // set: member . member (a member reaching its own VIP)
	setFIPDNAT           // map: fip -> port address
	setFIPSNAT           // map: port address -> fip
	setFIPPorts          // set: port addresses with a fip (their egress may leave)
	setFIPAddrs          // set: every fip answered here
	setExt               // map: address . proto . port -> class: external addresses, any interface
	setExtBackend        // map: address . proto . port . index -> member . port
	setNP                // map: proto . port -> class: node ports, on the node addresses
	setNPBackend         // map: proto . port . index -> member . port
	setSNATFront         // set: address . proto . port of external frontends whose connections are source-NATed
	setSNATNP            // set: proto . port of node ports whose connections are source-NATed
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
	setExt:      {name: "external", isMap: true, keyLen: 12, decl: "ipv4_addr . inet_proto . inet_service : mark"},
	setExtBackend: {name: "external-backends", isMap: true, keyLen: 16,
		decl: "ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service"},
	setNP:        {name: "nodeports", isMap: true, keyLen: 8, decl: "inet_proto . inet_service : mark"},
	setNPBackend: {name: "nodeport-backends", isMap: true, keyLen: 12, decl: "inet_proto . inet_service . mark : ipv4_addr . inet_service"},
	setSNATFront: {name: "snat-frontends", keyLen: 12, decl: "ipv4_addr . inet_proto . inet_service"},
	setSNATNP:    {name: "snat-nodeports", keyLen: 8, decl: "inet_proto . inet_service"},
}

// classSet reports whether set i maps frontends to classes (whose pick
// chains must exist), and backendSet whether it maps them to members.
func classSet(i uint8) bool   { return i == setSvc || i == setExt || i == setNP }
func backendSet(i uint8) bool { return i == setBackend || i == setExtBackend || i == setNPBackend }

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

// A class names what a services (external, nodeports) element leads to:
// the member count in the low 13 bits (up to MaxMembers), the affinity
// timeout in seconds above them (up to 86400, 17 bits); 0 (no members)
// is the empty chain. The classes verdict map sends each class in use to
// its pick chain, so that services holds plain data: adding a verdict
// element makes the kernel validate every element of its map at commit,
// O(load balancers) per change.
const classBits = 13

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

// selectMembers returns the members of l that connections to listener ls
// go to: those serving it, only the local ones when local is set, and
// the backups only when no other is left.
func selectMembers(l *LB, ls Listener, local bool) []Member {
	var out, backups []Member
	k := ls.Key()
	for i := range l.Members {
		m := &l.Members[i]
		if !m.serves(k) || local && !m.Local {
			continue
		}
		if m.Backup {
			backups = append(backups, *m)
		} else {
			out = append(out, *m)
		}
	}
	if len(out) == 0 {
		return backups
	}
	return out
}

// lbElems returns the elements an LB owns. fips are the addresses of its
// floating IPs answered on ext; nodeAddrs the addresses its node ports
// answer on (for the affinity keys only).
func lbElems(l *LB, ext string, fips []netip.Addr, add func(e elem, val string)) {
	for _, ls := range l.Listeners {
		internal := selectMembers(l, ls, l.InternalLocal)
		external := selectMembers(l, ls, l.ExternalLocal)
		target := ls.TargetPort
		if target == 0 {
			target = ls.Port
		}
		// key is a frontend's key in its class map; the backend keys
		// append the member index.
		frontend := func(classSet, backendSet uint8, key []byte, ms []Member) {
			add(elem{classSet, string(key)}, string(putMark(nil, classOf(len(ms), l.Affinity))))
			for i, m := range ms {
				port := m.Port
				if port == 0 {
					port = target
				}
				bk := putMark(append([]byte(nil), key...), uint32(i))
				add(elem{backendSet, string(bk)}, string(putPort(putAddr(nil, m.Addr), port)))
			}
		}
		snat := func(a netip.Addr) {
			if !l.ExternalLocal {
				add(elem{setSNATFront, string(putPort(putProto(putAddr(nil, a), ls.Proto), ls.Port))}, "")
			}
		}
		if l.Iface != "" {
			frontend(setSvc, setBackend, svcKey(l.Iface, l.VIP, ls.Proto, ls.Port), internal)
		}
		if l.HostAccess {
			// Connections the host opens have no input interface: nft
			// reads iifname as "" in the output hook.
			frontend(setSvc, setBackend, svcKey("", l.VIP, ls.Proto, ls.Port), internal)
		}
		for _, f := range fips {
			frontend(setSvc, setBackend, svcKey(ext, f, ls.Proto, ls.Port), external)
			snat(f)
		}
		for _, a := range l.External {
			frontend(setExt, setExtBackend, putPort(putProto(putAddr(nil, a), ls.Proto), ls.Port), external)
			snat(a)
		}
		if ls.NodePort != 0 {
			k := putPort(putProto(nil, ls.Proto), ls.NodePort)
			frontend(setNP, setNPBackend, k, external)
			if !l.ExternalLocal {
				add(elem{setSNATNP, string(k)}, "")
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

// affinityTails lists the frontends of l as the affinity map's keys end
// (address . proto . port): its VIP, FIPs and external addresses, and
// its node ports on every node address.
func affinityTails(l *LB, fips, nodeAddrs []netip.Addr) []string {
	var out []string
	for _, ls := range l.Listeners {
		for _, a := range append(append([]netip.Addr{l.VIP}, fips...), l.External...) {
			out = append(out, string(putPort(putProto(putAddr(nil, a), ls.Proto), ls.Port)))
		}
		if ls.NodePort != 0 {
			for _, a := range nodeAddrs {
				out = append(out, string(putPort(putProto(putAddr(nil, a), ls.Proto), ls.NodePort)))
			}
		}
	}
	return out
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

// getMark decodes a mark as putMark encodes it.
func getMark(v string) uint32 { return binary.NativeEndian.Uint32([]byte(v)) }

// getAddr and getPort decode, at the start of b, what putAddr and putPort
// encode; b must be long enough (4 and 2 bytes).
func getAddr(b string) netip.Addr { return netip.AddrFrom4([4]byte([]byte(b[:4]))) }
func getPort(b string) uint16     { return uint16(b[0])<<8 | uint16(b[1]) }
