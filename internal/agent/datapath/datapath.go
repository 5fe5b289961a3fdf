package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nfthost"
	"kurma.dev/kurma/pkg/kerrors"
)

// Interface is what the agent's reconciler needs from the datapath. Every
// method is idempotent; errors carry kerrors categories (NotFound for a
// missing network namespace or VPC, Invalid for bad specs, Conflict for a
// name held by a foreign object).
type Interface interface {
	// EnsureVPC creates or repairs the VPC's bridge (with its gateway
	// addresses), VXLAN device and isolation rules.
	EnsureVPC(ctx context.Context, v VPCSpec) error
	// DeleteVPC removes the VPC's bridge, VXLAN device and rules; a VPC
	// that does not exist is not an error.
	DeleteVPC(ctx context.Context, vni uint32) error
	// ListVPCs returns the VNIs of the VPCs that have an owned bridge or
	// VXLAN device on this host.
	ListVPCs(ctx context.Context) ([]uint32, error)
	// SetRemotes makes the VPC's FDB and neighbour entries exactly remotes.
	SetRemotes(ctx context.Context, vni uint32, remotes []Remote) error
	// Plug creates or repairs a port; the VPC must exist. Plugging a port
	// that is already plugged re-applies its settings without a new link.
	Plug(ctx context.Context, p PortSpec) error
	// Unplug removes a port; a port that is not plugged is not an error.
	Unplug(ctx context.Context, portID string) error
	// ListPorts returns the ports plugged on this host.
	ListPorts(ctx context.Context) ([]OwnedPort, error)
	// Cleanup removes what a crash left half-created. Call it once at
	// start, before anything else.
	Cleanup(ctx context.Context) error
}

// PortSpec is a port as the datapath plugs it.
type PortSpec struct {
	ID     string           // port id; names the host end of the veth pair
	VNI    uint32           // the VPC whose bridge the host end joins
	NetNS  string           // path of the pod's network namespace
	IfName string           // name of the container end inside NetNS
	MAC    net.HardwareAddr // MAC of the container end
	Addrs  []PortAddr       // at least one
	// AdminDown keeps both ends of the pair down (admin_state_up false):
	// plugged and configured, but passing no traffic.
	AdminDown bool
}

// PortAddr is one address of a port and its subnet's gateway.
type PortAddr struct {
	Addr    net.IPNet // the port's address with the subnet's prefix length
	Gateway net.IP    // may be nil: then no default route for this family
}

// VPCSpec describes a VPC's presence on this host.
type VPCSpec struct {
	VNI uint32
	// Gateways are put on the bridge: each subnet's gateway address with
	// the subnet's prefix length. Addresses not listed are removed.
	Gateways []net.IPNet
}

// Remote is a port on another host of the same VPC.
type Remote struct {
	MAC  net.HardwareAddr
	IPs  []net.IP
	VTEP net.IP // the remote host's underlay address
}

// OwnedPort is a plugged port found on the host.
type OwnedPort struct {
	ID     string
	HostIf string // name of the host end
	VNI    uint32 // VPC of the bridge it is attached to (0: detached)
}

// Config configures a Datapath.
type Config struct {
	// HostNS is the path of the network namespace that plays the host;
	// empty means the namespace the process runs in.
	HostNS string
	// Prefix starts every link name we create (1-5 characters); default "ka".
	Prefix string
	// Owner tags the aliases of our links; default "kurma-agent".
	Owner string
	// UnderlayIP is this host's VTEP address (required).
	UnderlayIP net.IP
	// UnderlayDev carries VXLAN traffic; empty lets routing choose.
	UnderlayDev string
	// VXLANPort is the UDP destination port; default 4789.
	VXLANPort int
	// MTU of pod interfaces, bridges and VXLAN devices; default the
	// underlay device's MTU minus the VXLAN overhead (50), or 1450.
	MTU int
	// NFTTable names our inet table; default "kurma-agent".
	NFTTable string
	// AcceptMark, when non-zero, lets packets whose mark has these bits
	// cross VPC isolation (the load balancer datapath sets them on its
	// NATed flows; use the same value there).
	AcceptMark uint32
	// Forwarding turns on IPv4/IPv6 forwarding in the host namespace (for
	// routing between the subnets of one VPC).
	Forwarding bool
	Logger     *slog.Logger
}

// Datapath is the netlink implementation of Interface.
type Datapath struct {
	cfg   Config
	names names
	h     *netlink.Handle // bound to the host namespace; safe for concurrent use
	vtep  net.IP
	devIx int // underlay device index, 0 when unset
	mtu   int
	log   *slog.Logger
	seq   atomic.Uint32 // numbers requestEcho's requests

	nftMu sync.Mutex            // guards nft, bnft, gconn and gin (one transaction at a time)
	nft   knftables.Interface   // inet table (VPC isolation), bound to the host namespace at creation
	bnft  knftables.Interface   // bridge table of the same name (port guards): its skeleton
	gnsf  *os.File              // the host namespace (plugs move host ends there)
	gconn *nfthost.Conn         // guard set elements, through netlink
	gw    nfthost.ElementWriter // writes guard elements: gconn (tests: a nfthost.Recorder)
	gr    nfthost.Reader        // reads the guards and rules back: gconn (tests: a nfthost.Recorder)
	gsets [gsCount]*nftables.Set
	gin   map[gelem]bool // guard elements in the kernel; nil: unknown (the next SetGuards writes them whole)

	// bridges holds each VPC bridge's index (uint32 VNI → int) as its
	// last EnsureVPC or Plug found it, so that a plug creates its pair
	// without looking the bridge up; a plug that fails with it looks
	// again.
	bridges sync.Map
}

var _ Interface = (*Datapath)(nil)

const vxlanOverhead = 50

// New opens the host namespace, checks the underlay and creates the nft
// table. Close releases the netlink handle.
func New(ctx context.Context, cfg Config) (_ *Datapath, retErr error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "ka"
	}
	if cfg.Owner == "" {
		cfg.Owner = "kurma-agent"
	}
	if cfg.VXLANPort == 0 {
		cfg.VXLANPort = 4789
	}
	if cfg.NFTTable == "" {
		cfg.NFTTable = "kurma-agent"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nm, err := newNames(cfg.Prefix, cfg.Owner)
	if err != nil {
		return nil, err
	}
	if cfg.UnderlayIP == nil || cfg.UnderlayIP.IsUnspecified() {
		return nil, kerrors.New(kerrors.Invalid, "datapath: an underlay IP is required")
	}
	if cfg.VXLANPort < 1 || cfg.VXLANPort > 65535 {
		return nil, kerrors.New(kerrors.Invalid, "datapath: vxlan port %d out of range", cfg.VXLANPort)
	}
	d := &Datapath{cfg: cfg, names: nm, vtep: cfg.UnderlayIP, log: cfg.Logger}
	if cfg.HostNS == "" {
		d.h, err = netlink.NewHandle()
	} else {
		var nsh netns.NsHandle
		nsh, err = netns.GetFromPath(cfg.HostNS)
		if err != nil {
			return nil, kerrors.New(kerrors.NotFound, "host netns %s: %v", cfg.HostNS, err)
		}
		d.h, err = netlink.NewHandleAt(nsh)
		_ = nsh.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("datapath: netlink handle: %w", err)
	}
	defer func() {
		if retErr != nil {
			d.h.Close()
		}
	}()
	d.mtu = cfg.MTU
	if cfg.UnderlayDev != "" {
		l, err := d.h.LinkByName(cfg.UnderlayDev)
		if err != nil {
			return nil, kerrors.New(kerrors.NotFound, "underlay device %s: %v", cfg.UnderlayDev, err)
		}
		d.devIx = l.Attrs().Index
		if d.mtu == 0 {
			d.mtu = l.Attrs().MTU - vxlanOverhead
		}
	}
	if d.mtu == 0 {
		d.mtu = 1500 - vxlanOverhead
	}
	if d.mtu < 576 {
		return nil, kerrors.New(kerrors.Invalid, "datapath: mtu %d too small", d.mtu)
	}
	if cfg.Forwarding {
		err = d.inHost(func() error {
			for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
				if err := os.WriteFile(p, []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("enable forwarding: %w", err)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("datapath: %w", err)
		}
	}
	if d.nft, err = nfthost.Knft(cfg.HostNS, knftables.InetFamily, cfg.NFTTable); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	if d.bnft, err = nfthost.Knft(cfg.HostNS, knftables.BridgeFamily, cfg.NFTTable); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	nsPath := cfg.HostNS
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	if d.gnsf, err = os.Open(nsPath); err != nil {
		return nil, kerrors.New(kerrors.NotFound, "host netns %s: %v", nsPath, err)
	}
	defer func() {
		if retErr != nil {
			_ = d.gnsf.Close()
		}
	}()
	if d.gconn, err = nfthost.Open(cfg.HostNS); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	d.gw, d.gr = d.gconn, d.gconn
	d.gsets = guardSetsOf(cfg.NFTTable)
	if err := d.syncIsolation(ctx); err != nil {
		_ = d.gconn.Close()
		return nil, err
	}
	return d, nil
}

// Close releases the netlink handles. It leaves every port and VPC in
// place.
func (d *Datapath) Close() error {
	d.h.Close()
	return errors.Join(d.gconn.Close(), d.gnsf.Close())
}

// MTU is the MTU given to pod interfaces.
func (d *Datapath) MTU() int { return d.mtu }

// inHost runs f on a locked OS thread inside the host namespace (or
// directly, when the host namespace is the process's own).
func (d *Datapath) inHost(f func() error) error {
	if d.cfg.HostNS == "" {
		return f()
	}
	return ns.WithNetNSPath(d.cfg.HostNS, func(ns.NetNS) error { return f() })
}

// podHandle opens a netlink handle inside the pod namespace at path.
// A missing namespace is a kerrors.NotFound error. The handle has only a
// NETLINK_ROUTE socket (links, addresses, routes: all a plug needs there):
// each socket costs two setns calls and a socket, and the default set is
// three families.
func podHandle(path string) (*netlink.Handle, netns.NsHandle, error) {
	if path == "" {
		return nil, 0, kerrors.New(kerrors.Invalid, "no network namespace given")
	}
	nsh, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, 0, kerrors.New(kerrors.NotFound, "network namespace %s does not exist", path)
		}
		return nil, 0, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		_ = nsh.Close()
		return nil, 0, kerrors.New(kerrors.Invalid, "%s is not a network namespace: %v", path, err)
	}
	return h, nsh, nil
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf)
}

func checkCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	return nil
}

// BridgeName is the name of the VPC's bridge on this host: the interface
// its pods' routed packets arrive on.
func (d *Datapath) BridgeName(vni uint32) string { return d.names.bridge(vni) }

// BridgeGlob is an nft interface-name wildcard that matches the bridge of
// every VPC of this datapath and no other link of it.
func (d *Datapath) BridgeGlob() string { return d.names.prefix + "b*" }
