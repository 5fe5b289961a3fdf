package manager

import (
	"context"
	"errors"

	"log/slog"
	"sync"
	"time"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// State is where a network's plugin container is in its life.
type State string

// Network states. A network starts Starting (its plugin container is being
// started), is Running once the plugin is up, and Failed when the plugin's
// main executable exited or could not be started; the supervisor then
// restarts it.
const (
	Starting State = "starting"
	Running  State = "running"
	Failed   State = "failed"
)

// Defaults of Options.
const (
	DefaultCallTimeout = 60 * time.Second
	DefaultDelAttempts = 3
)

// Options configures a Manager.
type Options struct {
	// Networks are the configured networks (netconf.Parse or Default).
	Networks []netconf.Network
	// Caller runs the plugin executables (required).
	Caller Caller
	// CallTimeout bounds one add or del call (DefaultCallTimeout).
	CallTimeout time.Duration
	// DelAttempts bounds the tries of a failing del (DefaultDelAttempts).
	DelAttempts int
	// InitialState is every network's state before a supervisor reports
	// on it: Running when empty (a HostCaller needs no container).
	InitialState State
	// NetNSDir, when set, is where each pod's network namespace is bound
	// (<NetNSDir>/<pod UUID>) for the duration of its attachment; that
	// path is the NETNS_PATH of the calls. The networking pod mounts the
	// dir at the same path (PrepareNetNSDir). Empty: the pod's own NetNS.
	NetNSDir string
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// NetworkInfo is one line of `kurma net ls`.
type NetworkInfo struct {
	Name     string `json:"name"`
	Image    string `json:"image"`
	Default  bool   `json:"default"`
	State    State  `json:"state"`
	Error    string `json:"error,omitempty"`
	Restarts int    `json:"restarts,omitempty"`
}

// Manager attaches pods to networks; it is a pod.Networker.
type Manager struct {
	opts Options
	log  *slog.Logger

	// mu guards states, changed and podLocks.
	mu       sync.Mutex
	states   map[string]*NetworkInfo
	changed  chan struct{} // closed and replaced on every state change
	podLocks map[string]*podLock
}

type podLock struct {
	mu   sync.Mutex
	refs int // guarded by Manager.mu
}

var _ pod.Networker = (*Manager)(nil)

// New validates opts and returns a Manager.
func New(opts Options) (*Manager, error) {
	if opts.Caller == nil {
		return nil, errors.New("network manager: Options.Caller is required")
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.DelAttempts <= 0 {
		opts.DelAttempts = DefaultDelAttempts
	}
	if opts.InitialState == "" {
		opts.InitialState = Running
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Manager{opts: opts, log: opts.Logger, states: map[string]*NetworkInfo{},
		changed: make(chan struct{}), podLocks: map[string]*podLock{}}
	for _, n := range opts.Networks {
		if _, dup := m.states[n.Name]; dup {
			return nil, kerrors.New(kerrors.Conflict, "network %q is configured twice", n.Name)
		}
		m.states[n.Name] = &NetworkInfo{Name: n.Name, Image: n.ACI, Default: n.Default, State: opts.InitialState}
	}
	return m, nil
}

// Networks returns the configured networks.
func (m *Manager) Networks() []netconf.Network {
	return append([]netconf.Network(nil), m.opts.Networks...)
}

// List returns every network's state, in configuration order.
func (m *Manager) List(ctx context.Context) []NetworkInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]NetworkInfo, 0, len(m.opts.Networks))
	for _, n := range m.opts.Networks {
		out = append(out, *m.states[n.Name])
	}
	return out
}

// SetState records a network's state; reason is kept for Failed. Unknown
// names are ignored.
func (m *Manager) SetState(name string, s State, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.states[name]
	if !ok {
		return
	}
	if s != Failed && st.State == Failed {
		st.Restarts++
	}
	st.State = s
	st.Error = ""
	if s == Failed {
		st.Error = reason
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// waitRunning waits until the network is Running: a Failed network is an
// Unavailable error at once, a Starting one is waited for until ctx ends.
func (m *Manager) waitRunning(ctx context.Context, name string) error {
	for {
		m.mu.Lock()
		st := m.states[name]
		state, reason, ch := st.State, st.Error, m.changed
		m.mu.Unlock()
		switch state {
		case Running:
			return nil
		case Failed:
			return kerrors.New(kerrors.Unavailable, "network %q has failed: %s", name, reason)
		}
		select {
		case <-ctx.Done():
			return kerrors.New(kerrors.Unavailable, "network %q is still starting: %v", name, ctx.Err())
		case <-ch:
		}
	}
}

// CallTimeout is the bound of one add or del call.
func (m *Manager) CallTimeout() time.Duration { return m.opts.CallTimeout }

// WaitSettled waits until no network is Starting, or ctx ends.
func (m *Manager) WaitSettled(ctx context.Context) {
	m.waitWhile(ctx, func() bool {
		for _, st := range m.states {
			if st.State == Starting {
				return true
			}
		}
		return false
	})
}

// waitStarted waits, until ctx ends, while the network is Starting (a del
// right after a daemon restart must not run before the plugin is ready; a
// Failed plugin's del is still tried).
func (m *Manager) waitStarted(ctx context.Context, name string) {
	m.waitWhile(ctx, func() bool {
		st, ok := m.states[name]
		return ok && st.State == Starting
	})
}

// waitWhile waits, until ctx ends, while cond (called with mu held) is
// true, checking it again on every state change.
func (m *Manager) waitWhile(ctx context.Context, cond func() bool) {
	for {
		m.mu.Lock()
		wait, ch := cond(), m.changed
		m.mu.Unlock()
		if !wait {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// lockPod serialises calls for one pod; the returned func unlocks.
func (m *Manager) lockPod(uuid string) func() {
	m.mu.Lock()
	l, ok := m.podLocks[uuid]
	if !ok {
		l = &podLock{}
		m.podLocks[uuid] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.podLocks, uuid)
		}
		m.mu.Unlock()
	}
}

func (m *Manager) network(name string) (netconf.Network, error) {
	for _, n := range m.opts.Networks {
		if n.Name == name {
			return n, nil
		}
	}
	return netconf.Network{}, kerrors.New(kerrors.NotFound, "network %q is not configured", name)
}
