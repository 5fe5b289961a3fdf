package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kurma.dev/kurma/internal/api"
	"kurma.dev/kurma/internal/config"
	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
)

// Environment knobs of pod networking (docs/networking.md).
const (
	// envNetworkMode: "pod" (default) runs the plugins in the networking
	// pod and their add/del through the run call-in; "host" runs them as
	// host processes from the images' extracted root filesystems.
	envNetworkMode = "KURMA_NETWORK_MODE"
	// envNetworkCallTimeout bounds one add/del call (Go duration, 60s).
	envNetworkCallTimeout = "KURMA_NETWORK_CALL_TIMEOUT"
	// envNetNSDir is the host folder of the pods' netns references that
	// the networking pod mounts (pod mode; manager.DefaultNetNSDir).
	envNetNSDir = "KURMA_NETNS_DIR"
)

// netSetup is kurmad's pod networking: nil fields when it is off.
type netSetup struct {
	mgr       *manager.Manager
	podCaller *manager.PodCaller  // pod mode
	host      *manager.HostCaller // host mode
	sup       *manager.Supervisor // pod mode, made once the pod manager exists
	supDone   chan struct{}       // closed when sup.Run returned
	stateDir  string
	netnsDir  string // pod mode
	mode      string
	log       *slog.Logger
}

// newNetSetup parses pod_networks (the embedded default network when there
// are none, backed by <kurmad dir>/images/kurma-netplugin.aci). It returns
// nil, without error, when the default network's image is missing: pods
// then get only the loopback.
func newNetSetup(cfg *config.Config, log *slog.Logger) (*netSetup, error) {
	nets, err := netconf.Parse(cfg.PodNetworks)
	if err != nil {
		return nil, err
	}
	if len(nets) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		aci := filepath.Join(filepath.Dir(exe), "images", "kurma-netplugin.aci")
		if _, err := os.Stat(aci); err != nil {
			log.Warn("no pod_networks and no default plugin image: pods get only the loopback", "image", aci)
			return nil, nil
		}
		n, err := netconf.Default("file://" + aci)
		if err != nil {
			return nil, err
		}
		nets = []netconf.Network{n}
	}
	timeout := manager.DefaultCallTimeout
	if s := os.Getenv(envNetworkCallTimeout); s != "" {
		if timeout, err = time.ParseDuration(s); err != nil || timeout <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive duration", envNetworkCallTimeout, s)
		}
	}
	ns := &netSetup{mode: strings.ToLower(os.Getenv(envNetworkMode)), log: log,
		stateDir: filepath.Join(filepath.Dir(cfg.PodsDir), "network")}
	var caller manager.Caller
	switch ns.mode {
	case "host":
		ns.host = &manager.HostCaller{}
		caller = ns.host
	case "", "pod":
		ns.mode = "pod"
		ns.podCaller = &manager.PodCaller{Pod: manager.DefaultNetPodName, Apps: manager.AppNames(nets)}
		caller = ns.podCaller
		ns.netnsDir = os.Getenv(envNetNSDir)
		if ns.netnsDir == "" {
			ns.netnsDir = manager.DefaultNetNSDir
		}
		if err := manager.PrepareNetNSDir(ns.netnsDir); err != nil {
			return nil, fmt.Errorf("%s: %w", envNetNSDir, err)
		}
	default:
		return nil, fmt.Errorf("%s=%q: want host or pod", envNetworkMode, ns.mode)
	}
	ns.mgr, err = manager.New(manager.Options{Networks: nets, Caller: caller, CallTimeout: timeout,
		InitialState: manager.Starting, Logger: log, NetNSDir: ns.netnsDir})
	if err != nil {
		return nil, err
	}
	return ns, nil
}

// networker is the pod manager's hook (nil when networking is off).
func (ns *netSetup) networker() pod.Networker {
	if ns == nil {
		return nil
	}
	return ns.mgr
}

// start readies the plugins: in host mode it unpacks the images; in pod
// mode it starts the networking pod supervisor (until ctx ends).
func (ns *netSetup) start(ctx context.Context, store image.Store, pods pod.Manager) error {
	if ns == nil {
		return nil
	}
	ns.log.Info("pod networking", "mode", ns.mode, "networks", len(ns.mgr.Networks()))
	if ns.mode == "host" {
		manager.PrepareHostPlugins(ctx, store, ns.mgr, ns.host, ns.stateDir)
		return nil
	}
	ns.podCaller.Pods = pods
	sup, err := manager.NewSupervisor(manager.SupervisorOptions{Pods: pods, Manager: ns.mgr,
		NetNSDir: ns.netnsDir, StateDir: ns.stateDir, Logger: ns.log,
		CheckImage: func(ctx context.Context, aci string) error {
			img, err := store.Pull(ctx, aci, image.PullOptions{})
			if err != nil {
				return fmt.Errorf("pull plugin image %s: %w", aci, err)
			}
			if !manager.IsHostPrivileged(img.Manifest) {
				return fmt.Errorf("plugin image %s does not declare %s=true; a network plugin needs host privilege", aci, manager.HostPrivileged)
			}
			return nil
		}})
	if err != nil {
		return err
	}
	ns.sup = sup
	ns.supDone = make(chan struct{})
	go func() { defer close(ns.supDone); _ = sup.Run(ctx) }()
	// Other pods start once the networks are up (or failed), bounded.
	wctx, cancel := context.WithTimeout(ctx, ns.mgr.CallTimeout())
	defer cancel()
	ns.mgr.WaitSettled(wctx)
	return nil
}

// netPodName is the networking pod's name ("" when there is none).
func (ns *netSetup) netPodName() string {
	if ns == nil || ns.sup == nil {
		return ""
	}
	return ns.sup.PodName()
}

// stop removes the networking pod once its supervisor has ended (ctx is
// done); kurmad calls it after stopping every other pod.
func (ns *netSetup) stop(ctx context.Context) {
	if ns == nil || ns.sup == nil {
		return
	}
	select {
	case <-ns.supDone:
	case <-ctx.Done():
		return
	}
	ns.sup.Stop(ctx)
}

// ListNetworks adapts the manager to the API.
func (ns *netSetup) ListNetworks(ctx context.Context) []api.NetworkInfo {
	if ns == nil {
		return nil
	}
	var out []api.NetworkInfo
	for _, n := range ns.mgr.List(ctx) {
		out = append(out, api.NetworkInfo{Name: n.Name, Image: n.Image, Default: n.Default,
			State: string(n.State), Error: n.Error, Restarts: n.Restarts})
	}
	return out
}
