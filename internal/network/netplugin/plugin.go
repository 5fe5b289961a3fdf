package netplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/pkg/kerrors"
)

// Defaults inside the plugin image.
const (
	DefaultCNIPath  = "/opt/cni/bin"
	DefaultStateDir = netconf.PluginStateDir
	// RollbackTimeout bounds the DEL that undoes a failed ADD; it runs on a
	// fresh context so a cancelled call still cleans up.
	RollbackTimeout = 20 * time.Second
)

// Options configure a Plugin.
type Options struct {
	// CNIPath lists the folders searched for CNI plugin executables
	// (CNI_PATH); DefaultCNIPath when empty.
	CNIPath []string
	// StateDir holds the libcni result cache and the lock files;
	// DefaultStateDir when empty. It should be on a persistent volume.
	StateDir string
	// Logger receives progress logs; slog.Default() when nil.
	Logger *slog.Logger
}

// Plugin performs the add, del and check calls of one plugin image.
type Plugin struct {
	cni      *libcni.CNIConfig
	cniPath  []string
	stateDir string
	log      *slog.Logger
}

// New returns a Plugin; it creates the state folders.
func New(opts Options) (*Plugin, error) {
	if len(opts.CNIPath) == 0 {
		opts.CNIPath = []string{DefaultCNIPath}
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	for _, d := range []string{cacheDir(opts.StateDir), lockDir(opts.StateDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	return &Plugin{
		cni:      libcni.NewCNIConfigWithCacheDir(opts.CNIPath, cacheDir(opts.StateDir), nil),
		cniPath:  opts.CNIPath,
		stateDir: opts.StateDir,
		log:      opts.Logger,
	}, nil
}

func cacheDir(state string) string { return filepath.Join(state, "cache") }
func lockDir(state string) string  { return filepath.Join(state, "locks") }

// Add attaches the pod to the network and returns the CNI result in the
// config's cniVersion. When the config asks for it, CHECK runs right after.
// On any failure the partial attachment is deleted again, so a failed Add
// leaves nothing behind.
func (p *Plugin) Add(ctx context.Context, cfg *Config, a Attachment) (res types.Result, retErr error) {
	l, err := p.lock(ctx, cfg.List.Name, a.PodUUID)
	if err != nil {
		return nil, err
	}
	// A failed add leaves no attachment, so its lock file goes too.
	defer func() { l.unlock(retErr != nil) }()
	if err := p.findPlugins(cfg); err != nil {
		return nil, err
	}
	start := time.Now()
	rt := a.runtimeConf()
	// A second add without a del must not touch the live attachment (the
	// rollback of its failure would delete it).
	if cached, err := p.cni.GetNetworkListCachedResult(cfg.List, rt); err == nil && cached != nil {
		return nil, kerrors.New(kerrors.Conflict, "pod %s is already attached to network %q as %s; del it first",
			a.PodUUID, cfg.List.Name, a.IfName)
	}
	defer func() {
		if retErr != nil {
			p.rollback(ctx, cfg, rt)
		}
	}()
	res, err = p.cni.AddNetworkList(ctx, cfg.List, rt)
	if err != nil {
		return nil, fmt.Errorf("add pod %s to network %q: %w", a.PodUUID, cfg.List.Name, err)
	}
	if cfg.Check {
		if err := p.cni.CheckNetworkList(ctx, cfg.List, rt); err != nil {
			return nil, fmt.Errorf("check pod %s on network %q after add: %w", a.PodUUID, cfg.List.Name, err)
		}
	}
	if res != nil && cfg.List.CNIVersion != "" && res.Version() != cfg.List.CNIVersion {
		if conv, err := res.GetAsVersion(cfg.List.CNIVersion); err == nil {
			res = conv
		}
	}
	p.log.Info("added", "network", cfg.List.Name, "pod", a.PodUUID, "ifname", a.IfName, "plugins", cfg.Types(), "took", time.Since(start))
	return res, nil
}

// findPlugins checks that every plugin of the chain is installed, so a
// chain is not half-run for want of a later plugin.
func (p *Plugin) findPlugins(cfg *Config) error {
	for _, t := range cfg.Types() {
		if _, err := invoke.FindInPath(t, p.cniPath); err != nil {
			return kerrors.New(kerrors.Invalid, "network %q: plugin %q is not installed in %s: %v",
				cfg.List.Name, t, strings.Join(p.cniPath, ":"), err)
		}
	}
	return nil
}

// rollback undoes a failed add on a fresh context. When the chain's DEL
// fails (a plugin may choke on state its own ADD never made), every plugin
// is deleted on its own, last first, ignoring errors.
func (p *Plugin) rollback(ctx context.Context, cfg *Config, rt *libcni.RuntimeConf) {
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RollbackTimeout)
	defer cancel()
	err := p.cni.DelNetworkList(rbCtx, cfg.List, rt)
	if err == nil {
		return
	}
	p.log.Warn("rollback of failed add: chain del failed, deleting plugin by plugin", "network", cfg.List.Name, "pod", rt.ContainerID, "err", err)
	for i := len(cfg.List.Plugins) - 1; i >= 0; i-- {
		one := &libcni.NetworkConfigList{Name: cfg.List.Name, CNIVersion: cfg.List.CNIVersion,
			Plugins: cfg.List.Plugins[i : i+1], Bytes: cfg.List.Bytes}
		if err := p.cni.DelNetworkList(rbCtx, one, rt); err != nil {
			p.log.Warn("rollback of failed add", "network", cfg.List.Name, "pod", rt.ContainerID, "plugin", cfg.List.Plugins[i].Network.Type, "err", err)
		}
	}
}

// Del detaches the pod from the network, giving the plugins the cached ADD
// result as prevResult. It is idempotent: deleting an attachment that is
// gone, or whose namespace is gone, succeeds.
func (p *Plugin) Del(ctx context.Context, cfg *Config, a Attachment) error {
	l, err := p.lock(ctx, cfg.List.Name, a.PodUUID)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := p.cni.DelNetworkList(ctx, cfg.List, a.runtimeConf()); err != nil {
		l.unlock(false)
		return fmt.Errorf("delete pod %s from network %q: %w", a.PodUUID, cfg.List.Name, err)
	}
	l.unlock(true)
	p.log.Info("deleted", "network", cfg.List.Name, "pod", a.PodUUID, "ifname", a.IfName, "took", time.Since(start))
	return nil
}

// Check runs CNI CHECK for an existing attachment. It fails with NotFound
// when the attachment is not in the cache.
func (p *Plugin) Check(ctx context.Context, cfg *Config, a Attachment) error {
	l, err := p.lock(ctx, cfg.List.Name, a.PodUUID)
	if err != nil {
		return err
	}
	defer l.unlock(false)
	cached, err := p.cni.GetNetworkListCachedResult(cfg.List, a.runtimeConf())
	if err != nil {
		return fmt.Errorf("check pod %s on network %q: read cache: %w", a.PodUUID, cfg.List.Name, err)
	}
	if cached == nil {
		return kerrors.New(kerrors.NotFound, "check pod %s on network %q: no such attachment", a.PodUUID, cfg.List.Name)
	}
	if err := p.cni.CheckNetworkList(ctx, cfg.List, a.runtimeConf()); err != nil {
		return fmt.Errorf("check pod %s on network %q: %w", a.PodUUID, cfg.List.Name, err)
	}
	return nil
}

// GC deletes the cached attachments of this network whose network
// namespace no longer exists (the pod is gone without a del). It returns
// how many it deleted.
func (p *Plugin) GC(ctx context.Context, cfg *Config) (int, error) {
	atts, err := p.cni.GetCachedAttachments("")
	if err != nil {
		return 0, fmt.Errorf("gc: list cache: %w", err)
	}
	var errs []error
	n := 0
	for _, at := range atts {
		if at.Network != cfg.List.Name || netnsExists(at.NetNS) {
			continue
		}
		deleted, err := p.gcOne(ctx, cfg, at)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if deleted {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// gcOne deletes one stale attachment under its lock; deleted is false when
// a del got there first.
func (p *Plugin) gcOne(ctx context.Context, cfg *Config, at *libcni.NetworkAttachment) (deleted bool, retErr error) {
	l, err := p.lock(ctx, cfg.List.Name, at.ContainerID)
	if err != nil {
		return false, err
	}
	rt := &libcni.RuntimeConf{ContainerID: at.ContainerID, NetNS: at.NetNS, IfName: at.IfName,
		Args: at.CniArgs, CapabilityArgs: at.CapabilityArgs}
	// Re-read under the lock: a del may have run meanwhile.
	if cached, err := p.cni.GetNetworkListCachedResult(cfg.List, rt); err != nil || cached == nil {
		l.unlock(false)
		return false, nil
	}
	if err := p.cni.DelNetworkList(ctx, cfg.List, rt); err != nil {
		l.unlock(false)
		return false, fmt.Errorf("gc pod %s on network %q: %w", at.ContainerID, cfg.List.Name, err)
	}
	l.unlock(true)
	p.log.Info("gc: deleted stale attachment", "network", cfg.List.Name, "pod", at.ContainerID, "ifname", at.IfName, "netns", at.NetNS)
	return true, nil
}

func netnsExists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}
