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
	// envNetworkMode: "host" (default) runs the plugin images' add/del as
	// host processes from their extracted root filesystems; "pod" runs them
	// in the networking pod through the run call-in.
	envNetworkMode = "KURMA_NETWORK_MODE"
	// envNetworkCallTimeout bounds one add/del call (Go duration, 60s).
	envNetworkCallTimeout = "KURMA_NETWORK_CALL_TIMEOUT"
)

// netSetup is kurmad's pod networking: nil fields when it is off.
type netSetup struct {
	mgr       *manager.Manager
	podCaller *manager.PodCaller  // pod mode
	host      *manager.HostCaller // host mode
	sup       *manager.Supervisor // pod mode, made once the pod manager exists
	stateDir  string
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
	case "", "host":
		ns.mode, ns.host = "host", &manager.HostCaller{}
		caller = ns.host
	case "pod":
		ns.podCaller = &manager.PodCaller{Pod: manager.DefaultNetPodName}
		caller = ns.podCaller
	default:
		return nil, fmt.Errorf("%s=%q: want host or pod", envNetworkMode, ns.mode)
	}
	ns.mgr, err = manager.New(manager.Options{Networks: nets, Caller: caller, CallTimeout: timeout,
		InitialState: manager.Starting, Logger: log})
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
		Logger: ns.log})
	if err != nil {
		return err
	}
	ns.sup = sup
	go func() { _ = sup.Run(ctx) }()
	return nil
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
