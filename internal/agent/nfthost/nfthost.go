package nfthost

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/pkg/kerrors"
)

// Marks the agent's datapaths share. Each is one bit, so that they
// combine with each other and with the marks of others (kube-proxy,
// CNI plugins) that test and set their own bits only.
const (
	// AcceptMark is the packet-mark bit lbpath sets on the flows it NATs
	// (its Config.AcceptMark) and that the VPC isolation of datapath
	// lets through (datapath.Config.AcceptMark).
	AcceptMark uint32 = 0x00200000
	// CtMarkSNAT is the connection-mark bit of connections that lbpath's
	// nat-post chain masquerades.
	CtMarkSNAT uint32 = 0x00400000
)

// sockBuf is the send buffer of a Conn's socket: one transaction is one
// sendmsg, and a cold sync of tens of thousands of elements is tens of
// MiB (the default limit, wmem_max, is a few MiB).
const sockBuf = 64 << 20

// Inet is the nftables table name of the inet family (datapath's VPC
// isolation, lbpath, policypath).
func Inet(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
}

// Bridge is the table name of the bridge family (datapath's port guards).
func Bridge(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: nftables.TableFamilyBridge}
}

// ElementWriter queues set element changes and commits them as one
// transaction at Flush. *nftables.Conn (and so *Conn) implements it;
// Recorder fakes it.
type ElementWriter interface {
	SetAddElements(s *nftables.Set, els []nftables.SetElement) error
	SetDeleteElements(s *nftables.Set, els []nftables.SetElement) error
	Flush() error
}

var _ ElementWriter = (*nftables.Conn)(nil)

// Reader reads a table's chains, rules, sets and elements back from the
// kernel. *nftables.Conn (and so *Conn) implements it; Recorder is an
// empty kernel.
type Reader interface {
	ListChainsOfTableFamily(f nftables.TableFamily) ([]*nftables.Chain, error)
	GetRules(t *nftables.Table, c *nftables.Chain) ([]*nftables.Rule, error)
	GetSets(t *nftables.Table) ([]*nftables.Set, error)
	GetSetElements(s *nftables.Set) ([]nftables.SetElement, error)
}

var _ Reader = (*nftables.Conn)(nil)

// Conn is a lasting netlink connection to nftables in the host namespace.
type Conn struct {
	*nftables.Conn
	nsf *os.File
}

// Open connects to nftables in the network namespace at hostNS ("" : the
// agent's own), with large socket buffers.
func Open(hostNS string) (*Conn, error) {
	if hostNS == "" {
		hostNS = "/proc/self/ns/net"
	}
	f, err := os.Open(hostNS)
	if err != nil {
		return nil, kerrors.New(kerrors.NotFound, "nftables: host netns %s: %v", hostNS, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting(), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("nftables netlink: %w", err)
	}
	return &Conn{Conn: c, nsf: f}, nil
}

// Close releases the connection; the kernel state stays.
func (c *Conn) Close() error {
	return errors.Join(c.CloseLasting(), c.nsf.Close())
}

// bigBuffers lets one sendmsg carry a large transaction and the socket
// receive its acks.
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20))
	})
	return errors.Join(err, serr)
}

// InHost runs f in the network namespace at hostNS ("" : where it is).
func InHost(hostNS string, f func() error) error {
	if hostNS == "" {
		return f()
	}
	return ns.WithNetNSPath(hostNS, func(ns.NetNS) error { return f() })
}

// Knft returns the nft interface to table of family, made in the host
// namespace (knftables probes nft there).
func Knft(hostNS string, family knftables.Family, table string) (knftables.Interface, error) {
	var nft knftables.Interface
	err := InHost(hostNS, func() error {
		var err error
		nft, err = knftables.New(family, table)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nftables %s %s: %w", family, table, err)
	}
	return nft, nil
}
