package agent

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kurma.dev/kurma/internal/agent/datapath"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Controller is the part of the controller API the agent uses;
// *controllerapi.Client implements it.
type Controller interface {
	RegisterHost(ctx context.Context, h controllerapi.Host) (*controllerapi.Host, error)
	SetPortStatus(ctx context.Context, projectID, id, status, reason string) (*controllerapi.Port, error)
	GetSubnet(ctx context.Context, projectID, id string) (*controllerapi.Subnet, error)
	WatchHostPorts(ctx context.Context, hostID string) iter.Seq2[controllerapi.Event, error]
	WatchHosts(ctx context.Context, since int64) iter.Seq2[controllerapi.Event, error]
}

// guardSetter is implemented by datapaths that enforce port_security.
type guardSetter interface {
	SetGuards(ctx context.Context, guards []datapath.Guard) error
}

// bridgeIndexer is implemented by datapaths that remember the index of
// each VPC's bridge (a port's host end joins it): a bridge made anew
// since a port's plug means the port must be plugged again.
type bridgeIndexer interface {
	BridgeIndex(vni uint32) int
}

// goneWatcher is implemented by datapaths that report vanished ports.
type goneWatcher interface {
	WatchGone(ctx context.Context, gone func(portID string)) error
}

// Config configures an Agent.
type Config struct {
	HostID     string
	UnderlayIP net.IP
	Controller Controller
	Datapath   datapath.Interface
	// Workers is the number of keys synced in parallel; default 4.
	Workers int
	// AttachWorkers, with LocalAttach, is the number of workers that take
	// only the keys of Attach and Detach (a CNI ADD or DEL waits on
	// them), which the others leave to them; default 16. A plug spends
	// most of a pod burst waiting for the kernel's RTNL lock, which the
	// runtime's sandbox starts and teardowns hold too: a plug that waits
	// must not hold up the ADDs behind it, as a plugin exec'd per ADD
	// (the bridge plugin) never does.
	AttachWorkers int
	// Resync is the period of the full level check (orphans, vanished
	// namespaces); default 30s.
	Resync time.Duration
	// Replug is how long a plugged port goes between full plugs when
	// nothing about it changes: the resyncs in between touch nothing of
	// an unchanged port (its namespace still there, its spec and its
	// VPC's bridge as at its last plug); a host end that vanishes is
	// reported by the datapath's link events and plugged again at once.
	// Default 10 × Resync.
	Replug time.Duration
	// BackoffBase and BackoffMax bound the retry delay of a failing key
	// and of a broken watch; defaults 50ms and 10s.
	BackoffBase, BackoffMax time.Duration
	// VPCLinger keeps a VPC's bridge, VXLAN device and isolation rules
	// this long after its last local port leaves, so a pod that follows
	// (the common churn: DEL then ADD on the same network) plugs without
	// recreating them and running nft. Zero removes the VPC at once.
	VPCLinger time.Duration
	// LB programs load balancers and floating IPs (optional: nil leaves
	// them alone). It needs a controller that streams them and a datapath
	// that names VPC bridges.
	LB LBPath
	// LocalAttach: a port bound here without network_ns waits, unplugged,
	// until Attach says where it goes (Kubernetes: internal/kube/cnid).
	// Without it such a port is reported ERROR.
	LocalAttach bool
	// HealthCheckAddr is the address health check node ports listen on
	// (healthcheck.go); empty: every address.
	HealthCheckAddr string
	Logger          *slog.Logger
	// Metrics, when set, gets the agent's Prometheus metrics (metrics.go).
	Metrics prometheus.Registerer

	// hooks are for this package's tests only; the zero value is what
	// a real agent runs with.
	hooks hooks
}

// hooks let a test see and steer what the agent does with time, so that
// a test proving that something does not happen waits on an event, not
// on a sleep. Nil fields do nothing (now: time.Now).
type hooks struct {
	// now is the clock of the VPC linger (when a VPC was found empty,
	// how long it is kept still). The linger's timer itself runs on
	// real time: a test with a fixed clock queues the VPC's key to
	// stand for it.
	now func() time.Time
	// lingered is called once syncVPC has decided on a VPC without
	// local ports: kept for left more (left > 0, its timer armed for
	// that), or removed (left <= 0, after the datapath removed it).
	lingered func(vni uint32, left time.Duration)
	// ensureWants is called when ensureVPC is about to wait for the
	// VPC's ensure lock.
	ensureWants func(vni uint32)
}

// Agent reconciles this host's datapath with the controller. Build it with
// New and call Run once.
//
// Its state is split by what it reconciles, each part with its own lock
// (none held across a network or netlink call; doc.go says which nest)
// and its own queue keys:
//
//   - ports and VPCs (keys "p/<id>", "v/<vni>", "g/"): the controller's
//     view in ports (cache.go), what was programmed per VPC in vpcs
//     (vpc.go); syncPort (port.go) and syncVPC;
//   - local attachments (Kubernetes: where a port goes, who waits on its
//     plug) in att (attach.go), read by syncPort;
//   - load balancers and floating IPs (keys "l/", "L/") in lb and hc
//     (lb.go, healthcheck.go).
type Agent struct {
	cfg Config
	dp  datapath.Interface
	c   Controller
	log *slog.Logger
	q   *queue
	m   *metrics // nil without Config.Metrics

	ports *portCache
	vpcs  *vpcState
	att   *attachments
	lb    *lbCache
	hc    *healthChecks // health check node ports

	resyncs atomic.Uint64 // periodic resyncs queued so far (tests wait on it)
}

// New checks cfg and returns an agent.
func New(cfg Config) (*Agent, error) {
	if cfg.HostID == "" || strings.ContainsAny(cfg.HostID, "/ \t\n") {
		return nil, kerrors.New(kerrors.Invalid, "agent: host id %q: want a non-empty word", cfg.HostID)
	}
	if cfg.UnderlayIP == nil || cfg.UnderlayIP.IsUnspecified() {
		return nil, kerrors.New(kerrors.Invalid, "agent: an underlay IP is required")
	}
	if cfg.Controller == nil || cfg.Datapath == nil {
		return nil, kerrors.New(kerrors.Invalid, "agent: a controller client and a datapath are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.AttachWorkers <= 0 {
		cfg.AttachWorkers = 16
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Replug <= 0 {
		cfg.Replug = 10 * cfg.Resync
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 50 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.hooks.now == nil {
		cfg.hooks.now = time.Now
	}
	q := newQueue(cfg.BackoffBase, cfg.BackoffMax)
	a := &Agent{
		cfg: cfg, dp: cfg.Datapath, c: cfg.Controller, log: cfg.Logger, q: q,
		ports: newPortCache(cfg.HostID), vpcs: newVPCState(), att: newAttachments(),
		lb: newLBCache(), hc: newHealthChecks(cfg.HealthCheckAddr, cfg.Logger),
	}
	a.m = newMetrics(cfg.Metrics, q, func() float64 { return float64(a.resyncs.Load()) })
	return a, nil
}

// Synced is closed once the agent has listed its ports and queued the
// first full sync.
func (a *Agent) Synced() <-chan struct{} { return a.ports.synced }

// Programmed reports whether the agent has listed its ports, every host
// and (when it programs them) every load balancer, and has programmed
// the load balancers once: from then on the kernel holds the
// controller's state (readiness).
func (a *Agent) Programmed() bool {
	return a.ports.isSynced() && a.ports.hostsListed() && (!a.lbEnabled() || a.lb.programmed())
}

// Run registers the host, then watches and reconciles until ctx ends. It
// returns nil on cancellation. Kernel state is left in place on exit: a
// restarted agent adopts it.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.dp.Cleanup(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := a.register(ctx); err != nil {
		return err
	}
	if w, ok := a.dp.(goneWatcher); ok {
		// A host end that vanishes (its namespace was deleted) is synced
		// at once instead of at the next resync.
		if err := w.WatchGone(ctx, func(id string) {
			a.ports.unmarkPlugged(id)
			a.q.Add(portKey(id))
		}); err != nil {
			a.log.Warn("no link events; relying on resync", "err", err)
		}
	}
	var wg sync.WaitGroup
	defer a.hc.close(context.Background())
	defer wg.Wait()
	defer a.q.Shutdown()
	wg.Go(func() { a.watchHosts(ctx) })
	wg.Go(func() { a.watchPorts(ctx) })
	if a.lbEnabled() {
		wg.Go(func() { a.watchLBs(ctx) })
	}
	take := takeAny
	if a.cfg.LocalAttach {
		// Workers of their own for the keys a CNI ADD or DEL waits on
		// (Attach, Detach), and only for them: a burst of new pods
		// fills the other workers with background syncs (arriving
		// ports, guards, load balancers, VPCs). More of them than the
		// plain workers: under a burst a plug mostly waits for the
		// RTNL lock behind the runtime's sandboxes, and four plugs
		// waiting held up every ADD behind them (bench/README.md).
		take = takePlain
		for range a.cfg.AttachWorkers {
			wg.Go(func() { a.work(ctx, takeUrgent) })
		}
	}
	for range a.cfg.Workers {
		wg.Go(func() { a.work(ctx, take) })
	}
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a.resync(ctx)
			a.resyncs.Add(1)
		}
	}
}

// register announces this host until the controller accepts it.
func (a *Agent) register(ctx context.Context) error {
	h := controllerapi.Host{ID: a.cfg.HostID, UnderlayIP: a.cfg.UnderlayIP.String()}
	delay := a.cfg.BackoffBase
	for {
		_, err := a.c.RegisterHost(ctx, h)
		if err == nil {
			a.log.Info("registered host", "host", h.ID, "underlay_ip", h.UnderlayIP)
			return nil
		}
		if errors.Is(err, kerrors.Invalid) || errors.Is(err, kerrors.Unauthorized) {
			return fmt.Errorf("agent: register host %s: %w", h.ID, err)
		}
		a.log.Warn("register host failed; retrying", "err", err, "in", delay)
		if !sleep(ctx, delay) {
			return nil
		}
		delay = min(delay*2, a.cfg.BackoffMax)
	}
}

// work syncs the keys it takes (takeAny, takeUrgent, takePlain) until
// the queue shuts down.
func (a *Agent) work(ctx context.Context, take int) {
	for {
		var (
			key        string
			waited     time.Duration
			urgent, ok bool
		)
		switch take {
		case takeUrgent:
			key, waited, ok = a.q.GetUrgent()
			urgent = true
		case takePlain:
			key, waited, ok = a.q.GetPlain()
		default:
			key, waited, urgent, ok = a.q.GetWaited()
		}
		if !ok {
			return
		}
		a.m.observeWait(key, waited, urgent)
		start := time.Now()
		err := a.sync(ctx, key, urgent)
		a.m.observeSync(key, start, err)
		a.q.Done(key)
		switch {
		case err == nil || ctx.Err() != nil:
			a.q.Forget(key)
		default:
			d := a.q.Retry(key)
			a.log.Warn("sync failed; retrying", "key", key, "err", err, "in", d)
		}
	}
}

// sync syncs one key; urgent says a CNI ADD or DEL waits on it.
func (a *Agent) sync(ctx context.Context, key string, urgent bool) error {
	kind, id, _ := strings.Cut(key, "/")
	switch kind {
	case "p":
		return a.syncPort(ctx, id, urgent)
	case "g":
		return a.syncGuards(ctx)
	case "l":
		// Before both listings the cache would drop what it has not
		// seen yet: a restarted agent would remove load balancers from
		// the kernel and add them back (the listing that completes last
		// queues it again).
		if !a.ports.isSynced() || !a.lb.listed() {
			return nil
		}
		return a.syncLBs(ctx)
	case "L":
		if !a.ports.isSynced() || !a.lb.listed() {
			return nil
		}
		return a.checkLBs(ctx)
	case "v":
		vni, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil // not a key we make
		}
		if !a.ports.hostsListed() {
			// A remote port whose host is not known yet would lose its
			// entries until the host listing brings them back; that
			// listing queues the VPCs again.
			return nil
		}
		return a.syncVPC(ctx, uint32(vni))
	}
	return nil
}

func portKey(id string) string { return "p/" + id }

// guardsKey is the one key for all port guards: they are one nft table.
const guardsKey = "g/"

func vpcKey(vni uint32) string { return "v/" + strconv.FormatUint(uint64(vni), 10) }

// resync enqueues every local port, every VPC with local ports, and every
// port and VPC the datapath owns (orphans are removed by their sync).
func (a *Agent) resync(ctx context.Context) {
	if !a.ports.isSynced() {
		return // until the first list, the cache cannot tell orphans
	}
	a.q.Add(guardsKey)
	if a.lbEnabled() {
		a.q.Add(lbKey)
		a.q.Add(lbCheckKey)
	}
	ids, vnis := a.ports.localIDs()
	for id := range ids {
		a.q.Add(portKey(id))
	}
	for vni := range vnis {
		a.q.Add(vpcKey(vni))
	}
	owned, err := a.dp.ListPorts(ctx)
	if err != nil {
		a.log.Warn("resync: list plugged ports", "err", err)
	}
	for _, o := range owned {
		a.q.Add(portKey(o.ID))
	}
	vpcs, err := a.dp.ListVPCs(ctx)
	if err != nil {
		a.log.Warn("resync: list vpcs", "err", err)
	}
	for _, vni := range vpcs {
		a.q.Add(vpcKey(vni))
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

var _ Controller = (*controllerapi.Client)(nil)
