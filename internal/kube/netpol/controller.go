package netpol

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/kerrors"
)

// Datapath programs the computed rules (the agent's policypath, through
// an adapter). Apply gets the pods whose rules changed (nil: gone), Sync
// the whole state, and must make the kernel equal to it.
type Datapath interface {
	Apply(ctx context.Context, changes map[string]*Rules) error
	Sync(ctx context.Context, all map[string]*Rules) error
}

// Config configures a Controller.
type Config struct {
	Kube     kubernetes.Interface
	NodeName string
	Datapath Datapath
	// Resync is the period of the full Sync that repairs drift (default
	// 5 minutes); a failed Apply also leads to one.
	Resync  time.Duration
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// VerifyAddr says whether ip is an address of the port made for the
	// pod with this UID, as the node's agent has it from the controller.
	// A pod whose address is known only from its kurma.dev/pod-networks
	// annotation (before the kubelet reports status.podIPs) gets that
	// address once VerifyAddr confirms it, not before: the pod's editors
	// can write the annotation, and a forged one would put another pod's
	// address under their policies, or among the peers others' policies
	// allow. Unconfirmed addresses are asked about again every
	// recheckEvery (and every 50 ms for a pod whose ADD waits). nil
	// confirms nothing (such pods wait for status.podIPs).
	VerifyAddr func(podUID string, ip netip.Addr) bool
}

// Controller watches pods, namespaces and NetworkPolicies, keeps an
// Engine and programs its changes.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	fac  informers.SharedInformerFactory
	m    *metrics
	kick chan struct{}
	// synced reports, per watch, that its handler has seen the initial
	// list.
	synced []cache.InformerSynced
	// arrived is when (UnixNano) the oldest watch event not yet handled
	// reached the process: the informers' transform stamps it as the
	// reflector queues the decoded event, before the informer's queue and
	// handler; 0: none waiting. The programming lag starts there. It
	// counts nanoseconds from epoch plus one (so that it keeps the
	// monotonic clock).
	arrived atomic.Int64
	epoch   time.Time

	mu         sync.Mutex // guards everything below
	eng        *Engine
	since      time.Time             // arrival of the oldest event not yet programmed
	handled    time.Time             // when that event's handler started
	programmed map[string]netip.Addr // local pod -> address whose rules are in the kernel
	waiters    map[string][]chan struct{}
	ready      bool // the first full Sync is done
	needFull   bool
	// unverified: pods whose annotation's address VerifyAddr has not
	// confirmed (the engine has them without an address), asked about
	// again by Run and, while an ADD waits for one, by WaitPod.
	unverified map[string]*corev1.Pod
}

// New builds the watches (started by Run).
func New(cfg Config) (*Controller, error) {
	if cfg.Kube == nil || cfg.NodeName == "" || cfg.Datapath == nil {
		return nil, kerrors.New(kerrors.Invalid, "netpol: a Kubernetes client, a node name and a datapath are required")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, m: newMetrics(cfg.Metrics), kick: make(chan struct{}, 1), epoch: time.Now(),
		eng: NewEngine(cfg.NodeName), programmed: map[string]netip.Addr{}, waiters: map[string][]chan struct{}{},
		unverified: map[string]*corev1.Pod{}}
	c.fac = informers.NewSharedInformerFactory(cfg.Kube, 0)
	pods := c.fac.Core().V1().Pods().Informer()
	nss := c.fac.Core().V1().Namespaces().Informer()
	pols := c.fac.Networking().V1().NetworkPolicies().Informer()
	for _, t := range []struct {
		inf cache.SharedIndexInformer
		f   func(any) (any, error)
	}{{pods, compactPod}, {nss, compactNamespace}, {pols, compactPolicy}} {
		f := t.f
		if err := t.inf.SetTransform(func(o any) (any, error) {
			c.arrived.CompareAndSwap(0, int64(time.Since(c.epoch))+1)
			if f == nil {
				return o, nil
			}
			return f(o)
		}); err != nil {
			return nil, fmt.Errorf("netpol: %w", err)
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		set func(any)
		del func(any)
	}{
		{pods, func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				c.setPod(p)
			}
		}, func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				delete(c.unverified, p.Namespace+"/"+p.Name)
				c.eng.DeletePod(p.Namespace, p.Name)
			}
		}},
		{nss, func(o any) {
			if n, ok := o.(*corev1.Namespace); ok {
				c.eng.SetNamespace(n.Name, n.Labels)
			}
		}, func(o any) {
			if n, ok := o.(*corev1.Namespace); ok {
				c.eng.DeleteNamespace(n.Name)
			}
		}},
		{pols, func(o any) {
			if np, ok := o.(*networkingv1.NetworkPolicy); ok {
				if err := c.eng.SetPolicy(np); err != nil {
					c.log.Warn("netpol: policy does not compile; it denies all for the pods it selects", "policy", np.Namespace+"/"+np.Name, "err", err)
				}
			}
		}, func(o any) {
			if np, ok := o.(*networkingv1.NetworkPolicy); ok {
				c.eng.DeletePolicy(np.Namespace, np.Name)
			}
		}},
	}
	for _, h := range handlers {
		set, del := h.set, h.del
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.event(func() { set(o) }) },
			UpdateFunc: func(_, o any) { c.event(func() { set(o) }) },
			DeleteFunc: func(o any) {
				if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = t.Obj
				}
				c.event(func() { del(o) })
			},
		})
		if err != nil {
			return nil, fmt.Errorf("netpol: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// compactPod keeps only what the engine reads, so that a watch of every
// pod of the cluster costs little memory.
func compactPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	c := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		ResourceVersion: p.ResourceVersion, Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIPs: p.Status.PodIPs}}
	if a, ok := p.Annotations[podnet.Annotation]; ok && len(p.Status.PodIPs) == 0 {
		c.Annotations = map[string]string{podnet.Annotation: a}
	}
	for _, ctr := range p.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, cp := range ctr.Ports {
			if cp.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: cp.Name, ContainerPort: cp.ContainerPort, Protocol: cp.Protocol})
			}
		}
		if len(ports) > 0 {
			c.Spec.Containers = append(c.Spec.Containers, corev1.Container{Ports: ports})
		}
	}
	return c, nil
}

// compactPolicy keeps only what the engine reads of a policy (its
// namespace, name and spec): the managed fields and annotations (kubectl's
// last-applied copy of the whole object among them) of 10,000 policies
// would otherwise stay in the informer's cache, and every garbage
// collection would mark them again.
func compactPolicy(o any) (any, error) {
	np, ok := o.(*networkingv1.NetworkPolicy)
	if !ok {
		return o, nil
	}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name, UID: np.UID,
		ResourceVersion: np.ResourceVersion, Generation: np.Generation}, Spec: np.Spec}, nil
}

// compactNamespace keeps a namespace's name and labels, for the same
// reason.
func compactNamespace(o any) (any, error) {
	n, ok := o.(*corev1.Namespace)
	if !ok {
		return o, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
		Labels: n.Labels}}, nil
}

// recheckEvery is how often Run asks VerifyAddr again about the
// addresses it has not confirmed (a pod's annotation may arrive before
// the agent has the pod's port).
const recheckEvery = 200 * time.Millisecond

// setPod gives the engine pod p; c.mu is held. The address of a pod that
// comes from its annotation alone is dropped until VerifyAddr confirms it
// (see Config.VerifyAddr).
func (c *Controller) setPod(p *corev1.Pod) {
	k := p.Namespace + "/" + p.Name
	delete(c.unverified, k)
	pp := PodFrom(p)
	if pp.IP.IsValid() && !statusHas(p, pp.IP) &&
		(c.cfg.VerifyAddr == nil || !c.cfg.VerifyAddr(string(p.UID), pp.IP)) {
		pp.IP = netip.Addr{}
		c.unverified[k] = p
	}
	c.eng.SetPod(pp)
}

// recheck asks VerifyAddr again about every unconfirmed address; those
// now confirmed reach the engine (and the next sync).
func (c *Controller) recheck() {
	if c.cfg.VerifyAddr == nil {
		return
	}
	var ok []*corev1.Pod
	c.mu.Lock()
	for _, p := range c.unverified {
		if c.cfg.VerifyAddr(string(p.UID), PodFrom(p).IP) {
			ok = append(ok, p)
		}
	}
	c.mu.Unlock()
	if len(ok) == 0 {
		return
	}
	// Not a watch event: its lag starts now, and a waiting event's
	// arrival stamp stays for that event's handler.
	now := time.Now()
	c.apply(func() {
		for _, p := range ok {
			if c.unverified[p.Namespace+"/"+p.Name] == p {
				c.setPod(p)
			}
		}
	}, now, now)
}

// statusHas reports whether ip is one of p's status.podIPs (the
// kubelet's, which the pod's editors cannot write).
func statusHas(p *corev1.Pod, ip netip.Addr) bool {
	for _, s := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(s.IP); err == nil && a == ip {
			return true
		}
	}
	return false
}

// event applies f to the engine and wakes the sync loop. The lag of
// what it dirties starts at the oldest waiting event's arrival (its
// queueing in the informer and the handler's own work count), or at
// the handler's start when none is stamped (an event whose arrival an
// earlier, no-op handler took).
func (c *Controller) event(f func()) {
	now := time.Now()
	t := now
	if a := c.arrived.Swap(0); a != 0 {
		t = c.epoch.Add(time.Duration(a - 1))
	}
	c.apply(f, t, now)
}

// apply applies f to the engine under c.mu and wakes the sync loop; what
// f dirties, if nothing was dirty yet, counts its lag from since (handled
// is when its handler began).
func (c *Controller) apply(f func(), since, handled time.Time) {
	c.mu.Lock()
	f()
	if c.eng.Dirty() > 0 && c.since.IsZero() {
		c.since, c.handled = since, handled
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run starts the watches, programs the full state once they have
// synced, then each change, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	start := time.Now()
	c.fac.Start(ctx.Done())
	defer c.fac.Shutdown()
	// The handlers' own sync, not only the caches': the first full sync
	// must see every object the initial lists returned.
	if err := waitSynced(ctx, c.synced); err != nil {
		return err
	}
	c.log.Info("netpol: watches synced", "took", time.Since(start))
	c.mu.Lock()
	c.needFull = true
	c.mu.Unlock()
	resync := time.NewTicker(c.cfg.Resync)
	defer resync.Stop()
	recheck := time.NewTicker(recheckEvery)
	defer recheck.Stop()
	retry := time.Duration(0)
	for {
		var err error
		if c.takeFull() {
			err = c.full(ctx)
		} else {
			err = c.partial(ctx)
		}
		if err != nil {
			c.m.errors.Inc()
			c.log.Error("netpol: sync failed; a full sync follows", "err", err)
			c.mu.Lock()
			c.needFull = true
			c.mu.Unlock()
			retry = min(max(2*retry, 100*time.Millisecond), 10*time.Second)
		} else {
			retry = 0
		}
		var after <-chan time.Time
		if retry > 0 {
			after = time.After(retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-after:
		case <-resync.C:
			c.mu.Lock()
			c.needFull = true
			c.mu.Unlock()
		case <-recheck.C:
			c.recheck()
		}
	}
}

// waitSynced waits until every handler has seen its watch's initial
// list, checking every 5 ms (client-go's WaitForCacheSync checks every
// 100 ms, which a cold start would wait for in vain).
func waitSynced(ctx context.Context, synced []cache.InformerSynced) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		done := true
		for _, s := range synced {
			done = done && s()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("netpol: watches did not sync: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

func (c *Controller) takeFull() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.needFull
	c.needFull = false
	return f
}

// full recomputes every local pod and makes the kernel equal to it.
func (c *Controller) full(ctx context.Context) error {
	start := time.Now()
	c.mu.Lock()
	c.eng.Compute()
	all := c.eng.All()
	since := c.since
	c.since = time.Time{}
	c.mu.Unlock()
	computed := time.Since(start)
	if err := c.cfg.Datapath.Sync(ctx, all); err != nil {
		return err
	}
	c.m.observe("full", start, since)
	c.mu.Lock()
	clear(c.programmed)
	for k, r := range all {
		c.programmed[k] = r.IP
	}
	c.ready = true
	c.wakeAll()
	c.mu.Unlock()
	c.log.Info("netpol: full sync", "local_pods", len(all), "compute", computed, "took", time.Since(start))
	return nil
}

// partial programs the dirty pods' changes.
func (c *Controller) partial(ctx context.Context) error {
	start := time.Now()
	c.mu.Lock()
	ch := c.eng.Compute()
	st := c.eng.LastStats()
	since, handled := c.since, c.handled
	c.since = time.Time{}
	c.mu.Unlock()
	if len(ch) > 0 {
		computed := time.Since(start)
		if err := c.cfg.Datapath.Apply(ctx, ch); err != nil {
			return err
		}
		c.m.observe("partial", start, since)
		if c.log.Enabled(ctx, slog.LevelDebug) && !since.IsZero() {
			// The oldest event's way: arrived (the watch decoded it) →
			// its handler started (the informer's queue) → this sync
			// started (the handler's engine work, the wake) → computed
			// → in the kernel.
			c.log.Debug("netpol: partial sync", "pods", len(ch), "compute", computed, "took", time.Since(start), "lag", time.Since(since),
				"queued", handled.Sub(since), "handler", start.Sub(handled), "arrived_us", since.UnixMicro(),
				"recomputed", st.Recomputed, "patched", st.Patched, "weights_built", st.WeightsBuilt)
		}
	}
	c.mu.Lock()
	for k, r := range ch {
		if r == nil {
			delete(c.programmed, k)
		} else {
			c.programmed[k] = r.IP
		}
	}
	c.wakeAll()
	c.mu.Unlock()
	return nil
}

// wakeAll wakes the waiters whose pod is programmed; c.mu is held.
func (c *Controller) wakeAll() {
	for k, ws := range c.waiters {
		if _, ok := c.programmed[k]; !ok {
			continue
		}
		for _, w := range ws {
			close(w)
		}
		delete(c.waiters, k)
	}
}

// WaitPod blocks until the rules of local pod namespace/name with address
// ip are in the kernel (after the first full sync), or ctx ends. The CNI
// ADD calls it before plugging the pod, so that a pod never sends or
// receives a packet its policies forbid.
//
// While the pod's address awaits VerifyAddr's confirmation (the agent may
// not have the pod's port yet), WaitPod asks again every 50 ms.
func (c *Controller) WaitPod(ctx context.Context, namespace, name string, ip netip.Addr) error {
	k := namespace + "/" + name
	var w chan struct{}
	for {
		c.mu.Lock()
		if c.ready && c.programmed[k] == ip {
			c.mu.Unlock()
			return nil
		}
		if w == nil {
			w = make(chan struct{})
			c.waiters[k] = append(c.waiters[k], w)
		}
		p := c.unverified[k]
		c.mu.Unlock()
		var again <-chan time.Time
		if p != nil {
			c.event(func() {
				if c.unverified[k] == p {
					c.setPod(p)
				}
			})
			again = time.After(50 * time.Millisecond)
		}
		select {
		case <-w:
			w = nil
		case <-again:
		case <-ctx.Done():
			return fmt.Errorf("netpol: rules of pod %s (%v) not programmed: %w", k, ip, ctx.Err())
		}
	}
}

// metrics: sync latency (by kind), event-to-programmed latency, errors.
type metrics struct {
	sync, lag *prometheus.HistogramVec
	errors    prometheus.Counter
}

var buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sync: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kurma_netpol_sync_seconds",
			Help: "Time of one NetworkPolicy sync (compute and program), by kind (full, partial).", Buckets: buckets}, []string{"kind"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kurma_netpol_programming_seconds",
			Help: "From the oldest watch event a sync covers to its rules being in the kernel, by kind.", Buckets: buckets}, []string{"kind"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kurma_netpol_sync_errors_total",
			Help: "NetworkPolicy syncs that failed (each is followed by a full sync)."}),
	}
	if reg != nil {
		reg.MustRegister(m.sync, m.lag, m.errors)
	}
	return m
}

func (m *metrics) observe(kind string, start, since time.Time) {
	m.sync.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	if !since.IsZero() {
		m.lag.WithLabelValues(kind).Observe(time.Since(since).Seconds())
	}
}
