// Command kurma-agent is the per-host network agent: it registers the host
// with the Kurma controller and plugs the ports bound to it (see
// internal/agent for the reconciler, internal/agent/datapath for the
// kernel side).
//
// It exits 0 on SIGTERM/SIGINT, leaving every port in place: a restarted
// agent adopts them. One agent per host: a lock file in --state-dir
// refuses a second one. With --uninstall it removes what an agent left on
// the host instead (uninstall.go) and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/internal/agent/lbpath"
	"kurma.dev/kurma/internal/agent/nfthost"
	"kurma.dev/kurma/internal/agent/policypath"
	"kurma.dev/kurma/internal/debugpprof"
	"kurma.dev/kurma/internal/gcflag"
	"kurma.dev/kurma/internal/kube/cnid"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/netpol"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/nice"
	"kurma.dev/kurma/pkg/controllerapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kurma-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		controllerURL = flag.String("controller", "http://127.0.0.1:9696", "controller base URL")
		token         = flag.String("token", "", "bearer token for the controller")
		tokenFile     = flag.String("token-file", "", "file holding the bearer token (overrides --token)")
		hostID        = flag.String("host-id", "", "this host's id (binding:host_id of its ports); default the hostname")
		underlayIP    = flag.String("underlay-ip", "", "this host's VXLAN endpoint address (required)")
		underlayDev   = flag.String("underlay-dev", "", "device carrying VXLAN traffic (optional)")
		stateDir      = flag.String("state-dir", "/var/lib/kurma-agent", "directory of the agent's lock file and, in Kubernetes mode, its attachment records (k8s/): keep it across restarts, a restarted agent keeps its pods plugged from those records")
		prefix        = flag.String("link-prefix", "ka", "prefix of every link the agent creates (1-5 characters)")
		nftTable      = flag.String("nft-table", "kurma-agent", "name of the agent's nftables inet table")
		mtu           = flag.Int("mtu", 0, "MTU of pod interfaces (default: underlay MTU - 50)")
		workers       = flag.Int("workers", 4, "ports synced in parallel")
		attachWorkers = flag.Int("attach-workers", 16, "with -k8s-node-name: CNI ADDs and DELs plugged in parallel (on workers of their own)")
		resync        = flag.Duration("resync", 30*time.Second, "period of the full level check")
		vpcLinger     = flag.Duration("vpc-linger", 3*time.Second, "keep a VPC's devices this long after its last local port goes (0: remove at once)")
		forwarding    = flag.Bool("ip-forward", true, "enable IP forwarding (routing between a VPC's subnets)")
		lbEnable      = flag.Bool("lb", true, "program load balancers and floating IPs")
		lbTable       = flag.String("lb-nft-table", "", "nftables inet table of load balancers and floating IPs (default: the --nft-table one, so that one table holds all the agent's rules)")
		extIface      = flag.String("external-interface", "", "interface toward the external network, where floating IPs are answered (empty: no floating IPs)")
		nodeIP        = flag.String("node-ip", "", "this host's node address: connections of node ports, external addresses and floating IPs of load balancers are source-NATed to it, and so is what the host sends into a VPC (default: --underlay-ip)")
		nodePortAddrs = flag.String("nodeport-addresses", "", "comma-separated addresses node ports answer on (default: --node-ip)")
		serviceCIDRs  = flag.String("service-cidr", "", "comma-separated ranges of load balancer VIPs the host must reach even without a route covering them (Kubernetes: the service range); each gets a route through lo from --node-ip")
		egress        = flag.Bool("egress", false, "let pods reach what lies outside their VPC, masqueraded to the outgoing interface's address (default: true with --k8s-node-name)")
		verbose       = flag.Bool("v", false, "debug logging")
		metricsAddr   = flag.String("metrics-listen", "127.0.0.1:9697", "address serving Prometheus /metrics and /healthz (empty: none)")
		pprofOn       = flag.Bool("pprof", false, "also serve Go's /debug/pprof/ on --metrics-listen (profiles reveal internals: keep the listener local)")

		closeWait     = flag.Duration("conntrack-tcp-timeout-close-wait", 0, "conntrack's timeout for TCP connections in CLOSE_WAIT in the host namespace, set by the load-balancer path (--lb) (default: 1h with --k8s-node-name, as kube-proxy sets it; 0 leaves the kernel's)")
		proxyHealthz  = flag.String("proxy-healthz-listen", "", "address answering as kube-proxy's health port, GET /healthz and /livez (default: 0.0.0.0:10256 with --k8s-node-name; \"none\": not served)")
		proxyStatus   = flag.String("proxy-status-listen", "", "address answering as kube-proxy's status port, GET /proxyMode (default: 127.0.0.1:10249 with --k8s-node-name; \"none\": not served)")
		k8sNode       = flag.String("k8s-node-name", "", "Kubernetes mode: this node's name (turns on the CNI daemon for the kurma-k8s driver)")
		k8sKubeconfig = flag.String("k8s-kubeconfig", "", "Kubernetes mode: kubeconfig file (default: in-cluster config)")
		k8sSocket     = flag.String("k8s-cni-socket", cniwire.DefaultSocket, "Kubernetes mode: unix socket the kurma-k8s shim dials")
		k8sTimeout    = flag.Duration("k8s-annotation-timeout", 10*time.Second, "Kubernetes mode: how long an ADD waits for the pod's annotation")
		k8sBinDir     = flag.String("k8s-install-cni-bin-dir", "", "Kubernetes mode: install the kurma-k8s shim (found next to this binary) into this directory")
		k8sConfDir    = flag.String("k8s-install-cni-conf-dir", "", "Kubernetes mode: write the kurma conflist into this directory")
		k8sPortmap    = flag.Bool("k8s-cni-portmap", false, "Kubernetes mode: chain the upstream portmap plugin (nftables backend, installed by the operator next to kurma-k8s) after kurma-k8s in the installed conflist, for hostPort")
		netPolicy     = flag.Bool("network-policy", true, "Kubernetes mode: enforce NetworkPolicy for this node's pods (a pod is plugged only once its rules are in place)")
		uninstall     = flag.Bool("uninstall", false, "remove what agents left on this host (links and routes they made, the --nft-table and --lb-nft-table tables, the shim and conflist of --k8s-install-cni-bin-dir and --k8s-install-cni-conf-dir, --state-dir) and exit; run it after the agent is gone")
		uninstallDirs = flag.String("uninstall-remove", "", "with --uninstall: comma-separated folders also emptied (e.g. the controller's bbolt folder, the CNI socket folder)")
		uninstallWait = flag.Bool("uninstall-wait", false, "with --uninstall: once done, wait for SIGTERM instead of exiting (a DaemonSet's pod)")
	)
	gcPercent := gcflag.Register(flag.CommandLine)
	niceness := flag.Int("nice", 0, "CPU priority of the agent (nice value, -20 to 19; 0: as started). A negative value keeps "+
		"pod plugs from waiting for a CPU behind a burst of sandbox starts (bench/README.md); it needs CAP_SYS_NICE")
	flag.Parse()
	debugpprof.SampleHeap(*pprofOn)
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	gc, gcFrom, err := gcPercent.Apply()
	if err != nil {
		return err
	}
	log.Info("go gc target", "gc_percent", gc, "from", gcFrom)
	if *uninstall {
		if *lbTable == "" {
			*lbTable = *nftTable
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		o := uninstallOpts{owner: "kurma-agent", nftTables: []string{*nftTable, *lbTable},
			routeProtocol: lbpath.DefaultRouteProtocol, stateDir: *stateDir, binDir: *k8sBinDir, confDir: *k8sConfDir}
		for _, d := range strings.Split(*uninstallDirs, ",") {
			if d = strings.TrimSpace(d); d != "" {
				o.extraDirs = append(o.extraDirs, d)
			}
		}
		if err := uninstallHost(ctx, o, log); err != nil {
			return err
		}
		if *uninstallWait {
			<-ctx.Done()
		}
		return nil
	}
	if *niceness != 0 {
		if err := nice.Set(*niceness); err != nil {
			return fmt.Errorf("--nice: %w", err)
		}
		log.Info("cpu priority", "nice", *niceness)
	}

	if *hostID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--host-id not given and no hostname: %w", err)
		}
		*hostID = h
	}
	ip := net.ParseIP(*underlayIP)
	if ip == nil {
		return fmt.Errorf("--underlay-ip %q: want an IP address", *underlayIP)
	}
	if *nodeIP == "" {
		*nodeIP = ip.String()
	}
	if *k8sNode != "" && !flagGiven("egress") {
		*egress = true // pods of a cluster reach the world through their node
	}
	if *k8sNode != "" && !flagGiven("conntrack-tcp-timeout-close-wait") {
		// As kube-proxy, whose part the agent takes: the kernel's 60 s
		// drops the NAT of a half-closed connection whose peer still
		// sends (the upstream spec "KubeProxy should set TCP CLOSE_WAIT
		// timeout").
		*closeWait = time.Hour
	}
	if !*lbEnable && *closeWait > 0 && flagGiven("conntrack-tcp-timeout-close-wait") {
		// The load-balancer path, whose NAT needs it, writes it.
		return fmt.Errorf("--conntrack-tcp-timeout-close-wait needs --lb")
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		*token = strings.TrimSpace(string(b))
	}
	unlock, err := lockStateDir(*stateDir)
	if err != nil {
		return err
	}
	defer unlock()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var opts []controllerapi.Option
	if *token != "" {
		opts = append(opts, controllerapi.WithToken(*token))
	}
	client, err := controllerapi.New(*controllerURL, opts...)
	if err != nil {
		return err
	}
	dp, err := datapath.New(ctx, datapath.Config{
		Prefix: *prefix, UnderlayIP: ip, UnderlayDev: *underlayDev, MTU: *mtu,
		NFTTable: *nftTable, Forwarding: *forwarding, AcceptMark: nfthost.AcceptMark, Logger: log,
	})
	if err != nil {
		return err
	}
	defer dp.Close()
	var lb agent.LBPath
	if *lbEnable {
		if *lbTable == "" {
			*lbTable = *nftTable
		}
		cfg := lbpath.Config{Table: *lbTable, ExtIface: *extIface, AcceptMark: nfthost.AcceptMark, Logger: log,
			BridgeGlob: dp.BridgeGlob(), Egress: *egress, ConntrackCloseWait: *closeWait}
		if cfg.NodeIP, err = netip.ParseAddr(*nodeIP); err != nil {
			return fmt.Errorf("--node-ip %q: want an IPv4 address", *nodeIP)
		}
		for _, s := range strings.Split(*nodePortAddrs, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil || !a.Is4() {
				return fmt.Errorf("--nodeport-addresses: %q is not an IPv4 address", s)
			}
			cfg.NodeAddrs = append(cfg.NodeAddrs, a)
		}
		for _, s := range strings.Split(*serviceCIDRs, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			pfx, err := netip.ParsePrefix(s)
			if err != nil || !pfx.Addr().Is4() {
				return fmt.Errorf("--service-cidr: %q is not an IPv4 prefix", s)
			}
			cfg.ServiceRoutes = append(cfg.ServiceRoutes, pfx)
		}
		p, err := lbpath.New(ctx, cfg)
		if err != nil {
			return err
		}
		defer p.Close()
		lb = p
	}
	reg := newRegistry()
	a, err := agent.New(agent.Config{
		HostID: *hostID, UnderlayIP: ip, Controller: client, Datapath: dp,
		Workers: *workers, AttachWorkers: *attachWorkers, Resync: *resync, VPCLinger: *vpcLinger, LB: lb, Logger: log,
		LocalAttach: *k8sNode != "", Metrics: reg, HealthCheckAddr: *nodeIP,
	})
	if err != nil {
		return err
	}
	log.Info("kurma-agent starting", "host", *hostID, "controller", *controllerURL, "underlay_ip", ip)
	if *k8sNode == "" {
		serveMetrics(ctx, *metricsAddr, reg, agentReady(a, nil), *pprofOn, log)
		err = a.Run(ctx)
		log.Info("kurma-agent stopped", "err", err)
		return err
	}
	kc, err := kubeClient(*k8sKubeconfig)
	if err != nil {
		return err
	}
	o := k8sOpts{node: *k8sNode, kubeconfig: *k8sKubeconfig, socket: *k8sSocket, hostID: *hostID,
		stateDir: filepath.Join(*stateDir, "k8s"), timeout: *k8sTimeout, binDir: *k8sBinDir, confDir: *k8sConfDir, portmap: *k8sPortmap, metrics: reg}
	runs := []func(context.Context) error{a.Run}
	if *netPolicy {
		pp, err := policypath.New(ctx, policypath.Config{Table: *nftTable, Logger: log})
		if err != nil {
			return err
		}
		defer pp.Close()
		// A local pod's address from its annotation counts once this
		// agent's record of the pod's port has it (issue 25).
		verify := func(uid string, ip netip.Addr) bool {
			return a.PortHasAddr(podnet.PortID(uid), uid, podnet.PortOwner, ip)
		}
		npc, err := netpol.New(netpol.Config{Kube: kc, NodeName: *k8sNode, Datapath: policyPath{pp}, Logger: log, Metrics: reg,
			VerifyAddr: verify})
		if err != nil {
			return err
		}
		o.policy = npc
		runs = append(runs, npc.Run)
	}
	d, err := newCNID(o, kc, a, log)
	if err != nil {
		return err
	}
	d.Restore() // before the agent's first sync, so that attached pods stay plugged
	runs = append(runs, d.Run)
	serveMetrics(ctx, *metricsAddr, reg, agentReady(a, d), *pprofOn, log)
	serveProxyCompat(ctx, listenOr(*proxyHealthz, "0.0.0.0:10256"), listenOr(*proxyStatus, "127.0.0.1:10249"), agentReady(a, d), log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(runs))
	for _, r := range runs {
		go func() { errc <- r(ctx) }()
	}
	err = <-errc
	cancel()
	for range len(runs) - 1 {
		if err2 := <-errc; err == nil {
			err = err2
		}
	}
	log.Info("kurma-agent stopped", "err", err)
	return err
}

// agentReady is the agent's readiness: synced with the controller (its
// ports, the hosts and the load balancers listed, the load balancers
// programmed) and, in Kubernetes mode, its pod watch synced with the API
// server.
func agentReady(a *agent.Agent, d *cnid.Daemon) func() error {
	return func() error {
		if !a.Programmed() {
			return errors.New("not synced with the controller yet")
		}
		if d != nil && !d.Synced() {
			return errors.New("pod watch not synced with the API server yet")
		}
		return nil
	}
}

// flagGiven reports whether the command line set flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// lockStateDir takes an exclusive lock on <dir>/agent.lock so that two
// agents never program the same host.
func lockStateDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "agent.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another kurma-agent holds %s", f.Name())
		}
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	_ = f.Truncate(0)
	_, _ = fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { _ = f.Close() }, nil
}

// listenOr is a listen flag's address: def when unset, none for "none".
func listenOr(flagVal, def string) string {
	switch flagVal {
	case "":
		return def
	case "none":
		return ""
	}
	return flagVal
}
