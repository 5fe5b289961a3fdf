package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/stager"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// Supervisor defaults.
const (
	DefaultNetPodName   = "kurma-networking"
	DefaultPollInterval = time.Second
	DefaultMinBackoff   = 500 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
)

// SupervisorOptions configures a Supervisor.
type SupervisorOptions struct {
	// Pods is the pod manager the networking pod runs in (required).
	Pods pod.Manager
	// Manager receives the networks' states (required).
	Manager *Manager
	// Name of the networking pod (DefaultNetPodName).
	Name string
	// NetNSDir is the host folder of the pods' netns references
	// (Manager's Options.NetNSDir, prepared by PrepareNetNSDir); the pod
	// mounts it at the same path in every plugin container, with slave
	// propagation. Empty: no such volume.
	NetNSDir string
	// StateDir holds one persistent folder per network (<StateDir>/<name>)
	// mounted at netconf.PluginStateDir in its container, so that IPAM
	// allocations and cached results outlive the pod. Empty: none.
	StateDir string
	// PollInterval is how often the plugin apps' status is checked.
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart; it doubles
	// on every failure in a row and resets once the pod ran for MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// CheckImage, when set, is asked once per network before the first
	// start whether its image may run in the networking pod (kurmad:
	// it must declare host privilege). A network whose image fails is
	// left out of the pod and stays Failed with that error.
	CheckImage func(ctx context.Context, aci string) error
	// Spec adjusts the networking pod's spec before it is created (host
	// volumes, stager options); may be nil.
	Spec   func(*pod.Spec)
	Logger *slog.Logger
}

// Supervisor keeps the networking pod running: one app per network (named
// by AppNames), from the network's image, in the host's network, IPC and
// UTS namespaces, the network's config on its main executable's stdin.
// When a plugin's main executable exits, its network is marked Failed (with
// the exit reason), and the pod is replaced after a backoff. A networking
// pod left running by a previous kurmad with the same spec is adopted.
type Supervisor struct {
	opts SupervisorOptions
	log  *slog.Logger
	// unusable holds the networks CheckImage refused, with the reason;
	// written once by Run before the first start, read-only after.
	unusable map[string]string
}

// NewSupervisor validates opts.
func NewSupervisor(opts SupervisorOptions) (*Supervisor, error) {
	if opts.Pods == nil || opts.Manager == nil {
		return nil, errors.New("network supervisor: Pods and Manager are required")
	}
	if opts.Name == "" {
		opts.Name = DefaultNetPodName
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.MinBackoff)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Supervisor{opts: opts, log: opts.Logger}, nil
}

// PodName is the networking pod's name (the PodCaller's target).
func (s *Supervisor) PodName() string { return s.opts.Name }

// AppNames maps each network to its app in the networking pod: the
// network's name when it is a valid AC name, else "net-<index>".
func AppNames(nets []netconf.Network) map[string]string {
	out := make(map[string]string, len(nets))
	used := map[string]bool{}
	for i, n := range nets {
		a := n.Name
		if !appc.ValidACName(a) || used[a] {
			a = fmt.Sprintf("net-%d", i)
		}
		used[a] = true
		out[n.Name] = a
	}
	return out
}

// Spec is the networking pod's spec.
func (s *Supervisor) Spec() pod.Spec {
	spec := pod.Spec{Name: s.opts.Name, Networks: []string{netconf.NetworkHost},
		HostIPC: true, HostUTS: true}
	nets := s.opts.Manager.opts.Networks
	apps := AppNames(nets)
	if s.opts.NetNSDir != "" {
		spec.VolumePropagation = true
		spec.Volumes = append(spec.Volumes, appc.Volume{Name: "netns", Kind: "host", Source: s.opts.NetNSDir})
	}
	for i, n := range nets {
		if _, bad := s.unusable[n.Name]; bad {
			continue
		}
		a := pod.AppSpec{Name: apps[n.Name], Image: n.ACI, Stdin: n.Config, HostPrivileged: true}
		if s.opts.NetNSDir != "" {
			a.Mounts = append(a.Mounts, appc.Mount{Volume: "netns", Path: s.opts.NetNSDir})
		}
		if s.opts.StateDir != "" {
			v := fmt.Sprintf("state-%d", i)
			spec.Volumes = append(spec.Volumes, appc.Volume{Name: v, Kind: "host", Source: s.stateDir(n.Name)})
			a.Mounts = append(a.Mounts, appc.Mount{Volume: v, Path: netconf.PluginStateDir})
		}
		spec.Apps = append(spec.Apps, a)
	}
	if s.opts.Spec != nil {
		s.opts.Spec(&spec)
	}
	return spec
}

func (s *Supervisor) stateDir(network string) string {
	return filepath.Join(s.opts.StateDir, network)
}

// Run keeps the networking pod running until ctx ends: it adopts a
// matching pod a previous kurmad left running, otherwise replaces it. It
// leaves the pod running when ctx ends (Stop removes it). It returns nil
// when ctx ends.
func (s *Supervisor) Run(ctx context.Context) error {
	s.checkImages(ctx)
	backoff := s.opts.MinBackoff
	adopt := true
	for {
		started := time.Now()
		reason := s.runOnce(ctx, adopt)
		adopt = false
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) >= s.opts.MaxBackoff {
			backoff = s.opts.MinBackoff
		}
		s.log.Warn("networking pod failed; restarting", "reason", reason, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
}

// Stop stops and removes the networking pod (kurmad calls it at shutdown
// after every other pod has stopped, and only when it stops pods).
func (s *Supervisor) Stop(ctx context.Context) {
	if err := s.opts.Pods.Remove(ctx, s.opts.Name, true); err != nil && !errors.Is(err, kerrors.NotFound) {
		s.log.Warn("remove networking pod", "err", err)
	}
}

// adoptable reports whether a running networking pod with the current spec
// and every plugin running exists.
func (s *Supervisor) adoptable(ctx context.Context) bool {
	p, err := s.opts.Pods.Get(ctx, s.opts.Name)
	if err != nil || p.State != pod.Running {
		return false
	}
	want, err1 := json.Marshal(s.Spec())
	have, err2 := json.Marshal(p.Spec)
	if err1 != nil || err2 != nil || !bytes.Equal(want, have) {
		s.log.Info("networking pod from before differs from the configuration; replacing it")
		return false
	}
	st, err := s.opts.Pods.Status(ctx, s.opts.Name)
	if err != nil {
		return false
	}
	for n, a := range AppNames(s.opts.Manager.opts.Networks) {
		if _, bad := s.unusable[n]; bad {
			continue
		}
		if x, ok := st[a]; !ok || x.Exited {
			return false
		}
	}
	return true
}

// runOnce creates (or adopts) the pod and watches it until a plugin exits,
// the pod is gone or ctx ends; it returns why it stopped.
func (s *Supervisor) runOnce(ctx context.Context, adopt bool) string {
	m := s.opts.Manager
	for _, n := range m.opts.Networks {
		if reason, bad := s.unusable[n.Name]; bad {
			m.SetState(n.Name, Failed, reason)
		} else {
			m.SetState(n.Name, Starting, "")
		}
	}
	if len(s.unusable) == len(m.opts.Networks) {
		<-ctx.Done() // nothing to run
		return "stopping"
	}
	if adopt && s.adoptable(ctx) {
		s.log.Info("adopted the running networking pod", "pod", s.opts.Name)
	} else {
		s.remove()
		if err := s.makeStateDirs(); err != nil {
			s.failAll(err.Error())
			return err.Error()
		}
		if _, err := s.opts.Pods.Create(ctx, s.Spec()); err != nil {
			reason := fmt.Sprintf("start networking pod: %v", err)
			s.failAll(reason)
			return reason
		}
	}
	for _, n := range m.opts.Networks {
		if _, bad := s.unusable[n.Name]; !bad {
			m.SetState(n.Name, Running, "")
		}
	}
	apps := AppNames(m.opts.Networks)
	t := time.NewTicker(s.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "stopping"
		case <-t.C:
		}
		st, err := s.status(ctx)
		if ctx.Err() != nil {
			return "stopping"
		}
		if err != nil {
			reason := fmt.Sprintf("networking pod: %v", err)
			s.failAll(reason)
			return reason
		}
		failed := ""
		for _, n := range m.opts.Networks {
			if _, bad := s.unusable[n.Name]; bad {
				continue
			}
			a, ok := st[apps[n.Name]]
			if !ok || !a.Exited {
				continue
			}
			reason := "plugin main executable exited"
			if a.ExitCode != nil {
				reason += fmt.Sprintf(" with status %d", *a.ExitCode)
			}
			if a.ExitReason != "" {
				reason += ": " + a.ExitReason
			}
			m.SetState(n.Name, Failed, reason)
			failed = n.Name + ": " + reason
		}
		if failed != "" {
			return failed
		}
	}
}

// status asks the networking pod's init directly over its socket (the
// default stager's, as PodCaller does for calls) and falls back to the
// status call-in. Polling through nsenter and a Go call-in every second
// cost a process start and its CPU each time.
func (s *Supervisor) status(ctx context.Context) (stagerspec.Status, error) {
	if p, err := s.opts.Pods.Get(ctx, s.opts.Name); err == nil && p.State == pod.Running && p.StagerPID > 0 {
		if st, err := stager.StatusAt(ctx, stager.HostSocketPath(p.StagerPID)); err == nil {
			return st, nil
		}
	}
	return s.opts.Pods.Status(ctx, s.opts.Name)
}

func (s *Supervisor) makeStateDirs() error {
	if s.opts.StateDir == "" {
		return nil
	}
	for _, n := range s.opts.Manager.opts.Networks {
		if err := os.MkdirAll(s.stateDir(n.Name), 0o700); err != nil {
			return fmt.Errorf("create network state dir: %w", err)
		}
	}
	return nil
}

// checkImages fills unusable through CheckImage.
func (s *Supervisor) checkImages(ctx context.Context) {
	s.unusable = map[string]string{}
	if s.opts.CheckImage == nil {
		return
	}
	for _, n := range s.opts.Manager.opts.Networks {
		if err := s.opts.CheckImage(ctx, n.ACI); err != nil {
			s.log.Error("network plugin unusable", "network", n.Name, "err", err)
			s.unusable[n.Name] = err.Error()
		}
	}
}

func (s *Supervisor) failAll(reason string) {
	for _, n := range s.opts.Manager.opts.Networks {
		if _, bad := s.unusable[n.Name]; bad {
			continue
		}
		s.opts.Manager.SetState(n.Name, Failed, reason)
	}
}

// remove force-removes the networking pod if it exists.
func (s *Supervisor) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Stop(ctx)
}
