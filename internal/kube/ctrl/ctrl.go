package ctrl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"kurma.dev/kurma/internal/kube/leader"
	"kurma.dev/kurma/pkg/kerrors"
)

// Queue is the controller's work queue of keys.
type Queue = workqueue.TypedRateLimitingInterface[string]

// ErrWaiting marks (wrapped in a Sync's error) a sync that cannot finish
// yet for a reason time resolves on its own, such as a deleted
// namespace whose pods are still terminating. The key is retried with
// backoff like any failed one, but logged at debug level until it has
// been waiting for Config.WaitWarn.
var ErrWaiting = errors.New("waiting")

// DefaultWaitWarn is Config.WaitWarn's default.
const DefaultWaitWarn = 5 * time.Minute

// Config configures a Controller.
type Config struct {
	// Name names the queue, the leader election and log lines
	// ("kurma-k8s-watcher").
	Name string
	// Kube is the client the Lease is held with (required with Lease).
	Kube kubernetes.Interface
	// Lease, when set, turns leader election on.
	Lease *leader.Lease
	// Informers are run by Run; their sync gates Setup, the workers and
	// Health.
	Informers []cache.SharedInformer
	// Sync reconciles one key by level (required). An error queues the
	// key again with backoff.
	Sync func(ctx context.Context, key string) error
	// Setup, when set, runs once per leadership before the workers.
	Setup func(ctx context.Context) error
	// Workers is the number of keys synced in parallel (default 8).
	Workers int
	// QPS and Burst bound the overall rate of queued retries and
	// rate-limited adds (default 200 and 1000).
	QPS   float64
	Burst int
	// ResyncKey, when set, is queued every Resync (default 60s).
	ResyncKey string
	Resync    time.Duration
	// Metrics, when set, receives the metrics named MetricsPrefix+"_...".
	Metrics       MetricsRegisterer
	MetricsPrefix string
	// KindOf names the kind of a key for the metrics' kind label
	// (default: "key").
	KindOf func(key string) string
	Logger *slog.Logger
	// WrapQueue, when set, wraps the queue (tests watch it this way).
	WrapQueue func(Queue) Queue
	// WaitWarn is how long a key may keep failing with ErrWaiting before
	// its retries are logged as warnings (default DefaultWaitWarn).
	WaitWarn time.Duration
}

// Controller runs one queue, its workers and (optionally) a leader
// election. Build it with New and call Run once.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	q      Queue
	m      *metrics
	synced []cache.InformerSynced

	leading     atomic.Bool  // this replica leads (lead runs)
	setUp       atomic.Bool  // this leadership's Setup is done
	lastSuccess atomic.Int64 // unix nanoseconds of the last successful sync, 0: none

	now func() time.Time // the clock of waitingSince (tests set it)
	// waitMu guards waitingSince: key -> the first of its current run of
	// ErrWaiting results. A key leaves it at any other result, so it
	// holds only keys being retried.
	waitMu       sync.Mutex
	waitingSince map[string]time.Time
}

// New checks cfg and builds the queue and metrics.
func New(cfg Config) (*Controller, error) {
	if cfg.Name == "" || cfg.Sync == nil {
		return nil, kerrors.New(kerrors.Invalid, "ctrl: a name and a sync function are required")
	}
	if cfg.Lease != nil {
		l := cfg.Lease
		if cfg.Kube == nil {
			return nil, kerrors.New(kerrors.Invalid, "%s: leader election needs a Kubernetes client", cfg.Name)
		}
		if l.Namespace == "" || l.Name == "" || l.Identity == "" {
			return nil, kerrors.New(kerrors.Invalid, "%s: lease namespace, name and identity are required", cfg.Name)
		}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.QPS <= 0 {
		cfg.QPS = 200
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 1000
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.KindOf == nil {
		cfg.KindOf = func(string) string { return "key" }
	}
	if cfg.WaitWarn <= 0 {
		cfg.WaitWarn = DefaultWaitWarn
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, now: time.Now, waitingSince: map[string]time.Time{}}
	c.q = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](20*time.Millisecond, 30*time.Second),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst)},
		),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: cfg.Name})
	if cfg.WrapQueue != nil {
		c.q = cfg.WrapQueue(c.q)
	}
	for _, inf := range cfg.Informers {
		c.synced = append(c.synced, inf.HasSynced)
	}
	m, err := newMetrics(cfg.Metrics, cfg.MetricsPrefix, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	c.m = m
	return c, nil
}

// Queue is the work queue; handlers add keys to it.
func (c *Controller) Queue() Queue { return c.q }

// Run starts the informers, waits for their caches and (as leader, when
// a Lease is configured) runs Setup and the workers until ctx ends. It
// returns nil on cancellation, Setup's error when it is permanent, and
// leader.ErrLost (wrapped) when the lease was lost.
func (c *Controller) Run(ctx context.Context) error {
	defer c.q.ShutDown()
	var infs sync.WaitGroup
	ictx, stop := context.WithCancel(ctx)
	defer func() { stop(); infs.Wait() }()
	for _, inf := range c.cfg.Informers {
		infs.Go(func() { inf.RunWithContext(ictx) })
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced...) {
		return nil // cancelled
	}
	if c.cfg.Lease == nil {
		return c.lead(ctx)
	}
	return leader.Run(ctx, c.cfg.Kube, *c.cfg.Lease, c.cfg.Name, c.log, c.lead)
}

// lead is the leader's part of Run.
func (c *Controller) lead(ctx context.Context) error {
	c.setUp.Store(false)
	c.leading.Store(true)
	defer c.leading.Store(false)
	if err := c.setup(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	c.setUp.Store(true)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer c.q.ShutDown()
	for range c.cfg.Workers {
		wg.Go(func() { c.work(ctx) })
	}
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if c.cfg.ResyncKey != "" {
				c.q.Add(c.cfg.ResyncKey)
			}
		}
	}
}

// setup runs Config.Setup until it succeeds, fails permanently
// (kerrors.Invalid, kerrors.Unauthorized) or ctx ends (nil).
func (c *Controller) setup(ctx context.Context) error {
	if c.cfg.Setup == nil {
		return nil
	}
	delay := 100 * time.Millisecond
	for {
		err := c.cfg.Setup(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, kerrors.Invalid) || errors.Is(err, kerrors.Unauthorized):
			return fmt.Errorf("%s: setup: %w", c.cfg.Name, err)
		}
		c.log.Warn(c.cfg.Name+": setup failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// work syncs keys until the queue shuts down.
func (c *Controller) work(ctx context.Context) {
	for {
		key, quit := c.q.Get()
		if quit {
			return
		}
		c.process(ctx, key)
	}
}

// process syncs one key taken from the queue.
func (c *Controller) process(ctx context.Context, key string) {
	defer c.q.Done(key)
	if ctx.Err() != nil {
		// The leadership ended: whoever leads next syncs it.
		c.q.Forget(key)
		c.waited(key, nil)
		return
	}
	start := time.Now()
	err := c.cfg.Sync(ctx, key)
	c.m.observe(c.cfg.KindOf(key), start, err)
	waited := c.waited(key, err)
	switch {
	case err == nil:
		c.lastSuccess.Store(time.Now().UnixNano())
		c.q.Forget(key)
	case ctx.Err() != nil:
		c.q.Forget(key)
		c.waited(key, nil)
	case waited >= 0 && waited < c.cfg.WaitWarn:
		c.log.Debug(c.cfg.Name+": sync waiting; retrying", "key", key, "err", err, "retries", c.q.NumRequeues(key), "waited", waited)
		c.q.AddRateLimited(key)
	default:
		args := []any{"key", key, "err", err, "retries", c.q.NumRequeues(key)}
		if waited >= 0 {
			args = append(args, "waited", waited)
		}
		c.log.Warn(c.cfg.Name+": sync failed; retrying", args...)
		c.q.AddRateLimited(key)
	}
}

// waited records the result err of key's sync and returns how long key
// has been waiting (its syncs failing with ErrWaiting), or -1 when err is
// not ErrWaiting.
func (c *Controller) waited(key string, err error) time.Duration {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	if err == nil || !errors.Is(err, ErrWaiting) {
		delete(c.waitingSince, key)
		return -1
	}
	now := c.now()
	since, ok := c.waitingSince[key]
	if !ok {
		c.waitingSince[key] = now
		return 0
	}
	return now.Sub(since)
}

// Status is what Health reports.
type Status struct {
	// Synced: the informers' caches have synced with the API server.
	Synced bool
	// Leading: this replica leads (always, without a Lease, once
	// synced); SetUp: its Setup is done and the workers run.
	Leading, SetUp bool
	// LastSuccess is the end of the last successful sync (zero: none
	// yet in this process).
	LastSuccess time.Time
	// Depth is the number of keys waiting.
	Depth int
}

// Status reports the controller's state.
func (c *Controller) Status() Status {
	s := Status{Synced: true, Leading: c.leading.Load(), SetUp: c.setUp.Load(), Depth: c.q.Len()}
	for _, f := range c.synced {
		if !f() {
			s.Synced = false
		}
	}
	if n := c.lastSuccess.Load(); n != 0 {
		s.LastSuccess = time.Unix(0, n)
	}
	return s
}

// Health says why the controller is not ready, or nil: its informers
// have not synced with the API server, or it leads and its setup is not
// done. A synced standby is ready (it can take over at once).
func (c *Controller) Health() error {
	s := c.Status()
	switch {
	case !s.Synced:
		return fmt.Errorf("%s: informers not synced with the API server yet", c.cfg.Name)
	case s.Leading && !s.SetUp:
		return fmt.Errorf("%s: leader: setup with the controller not done yet", c.cfg.Name)
	}
	return nil
}

// String is a one-line summary of Status for /healthz.
func (s Status) String() string {
	last := "never"
	if !s.LastSuccess.IsZero() {
		last = s.LastSuccess.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("synced=%t leading=%t setup=%t depth=%d last_successful_sync=%s",
		s.Synced, s.Leading, s.SetUp, s.Depth, last)
}
