package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/kerrors"
)

// The real plugin main is supervised: killed, its network is failed and
// refuses pods; it is restarted and pods attach again.
func TestHostMainRestart(t *testing.T) {
	e := newEnv(t)
	nw := e.bridgeNet("knmmain", "eth0", true)
	m, err := manager.New(manager.Options{Networks: []netconf.Network{nw}, Caller: e.caller,
		CallTimeout: 10 * time.Second, InitialState: manager.Starting})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var pids []int
	h := &manager.HostMain{Manager: m, Network: "knmmain",
		Argv: []string{testutil.Bin(t, "kurma-netplugin"), "main"}, Env: e.caller.Env,
		MinBackoff: 300 * time.Millisecond, MaxBackoff: time.Second,
		OnStart: func(pid int) { mu.Lock(); pids = append(pids, pid); mu.Unlock() }}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				t.Errorf("plugin main %d still runs after stop", pid)
			}
		}
	})
	started := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(pids) >= n && m.List(ctx)[0].State == manager.Running
		}
	}
	waitFor(t, "main running", started(1))
	p, _ := newPod(t)
	raw, err := m.Attach(ctx, p)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	p.Networks = raw

	mu.Lock()
	first := pids[0]
	mu.Unlock()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "failed", func() bool { return m.List(ctx)[0].State == manager.Failed })
	if ls := m.List(ctx)[0]; !strings.Contains(ls.Error, "killed") {
		t.Errorf("failure reason %q", ls.Error)
	}
	p2, _ := newPod(t)
	if _, err := m.Attach(ctx, p2); !errors.Is(err, kerrors.Unavailable) {
		t.Errorf("attach while failed: %v", err)
	}
	waitFor(t, "restarted", started(2))
	if ls := m.List(ctx)[0]; ls.Restarts != 1 {
		t.Errorf("restarts %d", ls.Restarts)
	}
	raw2, err := m.Attach(ctx, p2)
	if err != nil {
		t.Fatalf("attach after restart: %v", err)
	}
	p2.Networks = raw2
	if err := m.Detach(ctx, p); err != nil {
		t.Error(err)
	}
	if err := m.Detach(ctx, p2); err != nil {
		t.Error(err)
	}
}
