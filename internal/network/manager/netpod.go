package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"kurma.dev/kurma/internal/kerrors"
	"kurma.dev/kurma/internal/pod"
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
	// PollInterval is how often the plugin apps' status is checked.
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart; it doubles
	// on every failure in a row and resets once the pod ran for MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Spec adjusts the networking pod's spec before it is created (host
	// volumes, stager options); may be nil.
	Spec   func(*pod.Spec)
	Logger *slog.Logger
}

// Supervisor keeps the networking pod running: one app per network, named
// after it, from the network's image, in the host's network namespace. When
// a plugin's main executable exits, its network is marked Failed (with the
// exit reason), and the pod is replaced after a backoff.
type Supervisor struct {
	opts SupervisorOptions
	log  *slog.Logger
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

// Spec is the networking pod's spec.
func (s *Supervisor) Spec() pod.Spec {
	spec := pod.Spec{Name: s.opts.Name, Networks: []string{"host"}}
	for _, n := range s.opts.Manager.opts.Networks {
		spec.Apps = append(spec.Apps, pod.AppSpec{Name: n.Name, Image: n.ACI})
	}
	if s.opts.Spec != nil {
		s.opts.Spec(&spec)
	}
	return spec
}

// Run starts the networking pod (replacing one a previous daemon left) and
// keeps it running until ctx ends; it then stops and removes it on a
// detached context. It returns nil when ctx ends.
func (s *Supervisor) Run(ctx context.Context) error {
	backoff := s.opts.MinBackoff
	for {
		s.remove()
		started := time.Now()
		reason := s.runOnce(ctx)
		if ctx.Err() != nil {
			s.remove()
			return nil
		}
		if time.Since(started) >= s.opts.MaxBackoff {
			backoff = s.opts.MinBackoff
		}
		s.log.Warn("networking pod failed; restarting", "reason", reason, "backoff", backoff)
		select {
		case <-ctx.Done():
			s.remove()
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
}

// runOnce creates the pod and watches it until a plugin exits, the pod is
// gone or ctx ends; it returns why it stopped.
func (s *Supervisor) runOnce(ctx context.Context) string {
	m := s.opts.Manager
	for _, n := range m.opts.Networks {
		m.SetState(n.Name, Starting, "")
	}
	if _, err := s.opts.Pods.Create(ctx, s.Spec()); err != nil {
		reason := fmt.Sprintf("start networking pod: %v", err)
		s.failAll(reason)
		return reason
	}
	for _, n := range m.opts.Networks {
		m.SetState(n.Name, Running, "")
	}
	t := time.NewTicker(s.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "stopping"
		case <-t.C:
		}
		st, err := s.opts.Pods.Status(ctx, s.opts.Name)
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
			a, ok := st[n.Name]
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

func (s *Supervisor) failAll(reason string) {
	for _, n := range s.opts.Manager.opts.Networks {
		s.opts.Manager.SetState(n.Name, Failed, reason)
	}
}

// remove force-removes the networking pod if it exists.
func (s *Supervisor) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.opts.Pods.Remove(ctx, s.opts.Name, true); err != nil && !errors.Is(err, kerrors.NotFound) {
		s.log.Warn("remove networking pod", "err", err)
	}
}
