package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"kurma.dev/kurma/internal/kube/leader"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// ErrLostLease ends Run when another replica took the lease.
var ErrLostLease = leader.ErrLost

// Controller is the part of the controller API the watcher uses;
// *controllerapi.Client implements it.
type Controller interface {
	GetProject(ctx context.Context, id string) (*controllerapi.Project, error)
	CreateProject(ctx context.Context, p controllerapi.Project) (*controllerapi.Project, error)
	GetVPC(ctx context.Context, projectID, id string) (*controllerapi.VPC, error)
	CreateVPC(ctx context.Context, projectID string, v controllerapi.VPC) (*controllerapi.VPC, error)
	GetSubnet(ctx context.Context, projectID, id string) (*controllerapi.Subnet, error)
	ListSubnets(ctx context.Context, projectID, networkID string) ([]controllerapi.Subnet, error)
	CreateSubnet(ctx context.Context, projectID string, s controllerapi.Subnet) (*controllerapi.Subnet, error)
	DeleteSubnet(ctx context.Context, projectID, id string) error
	GetPort(ctx context.Context, projectID, id string) (*controllerapi.Port, error)
	ListPorts(ctx context.Context, projectID string, f controllerapi.PortFilter) ([]controllerapi.Port, error)
	CreatePort(ctx context.Context, projectID string, p controllerapi.Port) (*controllerapi.Port, error)
	DeletePort(ctx context.Context, projectID, id string) error
}

var _ Controller = (*controllerapi.Client)(nil)

// Lease configures leader election on a coordination.k8s.io Lease.
type Lease = leader.Lease

// Config configures a Watcher.
type Config struct {
	Kube       kubernetes.Interface
	Controller Controller
	// Project and VPC are the ids of the cluster's controller project and
	// VPC; defaults "k8s" and "k8s-pods".
	Project, VPC string
	// Pool is the range namespace subnets are cut from (default
	// 10.32.0.0/11), SubnetBits their prefix length (default 16).
	Pool       netip.Prefix
	SubnetBits int
	// Workers is the number of keys synced in parallel (default 8).
	Workers int
	// Resync is the period of the full resync (default 60s).
	Resync time.Duration
	// Lease, when set, turns leader election on.
	Lease *Lease
	// Metrics, when set, receives the watcher's Prometheus metrics
	// (docs/kubernetes.md).
	Metrics prometheus.Registerer
	Logger  *slog.Logger
	// FullPods caches whole Pod objects instead of the compact ones
	// (compactPod): for the benchmark of the cache's size only.
	FullPods bool
}

// Owner is the device_owner of every port the watcher creates.
const Owner = podnet.PortOwner

// Watcher keeps controller objects in step with the cluster. Build it
// with New and call Run once.
type Watcher struct {
	cfg  Config
	kube kubernetes.Interface
	c    Controller
	log  *slog.Logger
	q    workqueue.TypedRateLimitingInterface[string]
	m    *metrics

	factory informers.SharedInformerFactory
	pods    listersv1.PodLister
	podIdx  cache.Indexer
	nss     listersv1.NamespaceLister
	nodes   listersv1.NodeLister
	synced  []cache.InformerSynced

	mu      sync.Mutex                       // guards subnets; held while allocating a range
	subnets map[string]*controllerapi.Subnet // by namespace UID

	leading atomic.Bool // lead runs
	setUp   atomic.Bool // this term's setup with the controller is done
}

const uidIndex = "uid"

// New checks cfg and builds the informers (started by Run).
func New(cfg Config) (*Watcher, error) {
	if cfg.Kube == nil || cfg.Controller == nil {
		return nil, kerrors.New(kerrors.Invalid, "watcher: a Kubernetes client and a controller client are required")
	}
	if cfg.Project == "" {
		cfg.Project = "k8s"
	}
	if cfg.VPC == "" {
		cfg.VPC = "k8s-pods"
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = netip.MustParsePrefix("10.32.0.0/11")
	}
	if cfg.SubnetBits == 0 {
		cfg.SubnetBits = 16
	}
	if cfg.SubnetBits < cfg.Pool.Bits() || cfg.SubnetBits > cfg.Pool.Addr().BitLen()-2 {
		return nil, kerrors.New(kerrors.Invalid, "watcher: subnet size /%d does not fit pool %s", cfg.SubnetBits, cfg.Pool)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if l := cfg.Lease; l != nil {
		if l.Namespace == "" || l.Name == "" || l.Identity == "" {
			return nil, kerrors.New(kerrors.Invalid, "watcher: lease namespace, name and identity are required")
		}
	}
	w := &Watcher{
		cfg: cfg, kube: cfg.Kube, c: cfg.Controller, log: cfg.Logger,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[string](20*time.Millisecond, 30*time.Second),
				&workqueue.TypedBucketRateLimiter[string]{Limiter: newLimiter()},
			),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kurma-k8s-watcher"}),
		subnets: map[string]*controllerapi.Subnet{},
	}
	w.m = newMetrics(cfg.Metrics, w.q.Len)
	// No informer resync: the watcher's own full resync covers drift.
	w.factory = informers.NewSharedInformerFactory(cfg.Kube, 0)
	podInf := w.factory.Core().V1().Pods()
	if !cfg.FullPods {
		if err := podInf.Informer().SetTransform(compactPod); err != nil {
			return nil, fmt.Errorf("watcher: %w", err)
		}
	}
	if err := podInf.Informer().AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	nsInf := w.factory.Core().V1().Namespaces()
	nodeInf := w.factory.Core().V1().Nodes()
	w.pods, w.podIdx = podInf.Lister(), podInf.Informer().GetIndexer()
	w.nss, w.nodes = nsInf.Lister(), nodeInf.Lister()
	w.synced = []cache.InformerSynced{podInf.Informer().HasSynced, nsInf.Informer().HasSynced, nodeInf.Informer().HasSynced}

	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onPod(o) },
		UpdateFunc: func(_, o any) { w.onPod(o) },
		DeleteFunc: func(o any) { w.onPodDelete(o) },
	}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNamespace(o) },
		UpdateFunc: func(_, o any) { w.onNamespace(o) },
		DeleteFunc: func(o any) { w.onNamespace(o) },
	}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, o any) { w.onNodeUpdate(old, o) },
	}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	return w, nil
}

// compactPod is the pod informer's transform: the cache holds every pod
// of the cluster, and the watcher reads only its identity, node, host
// network, phase and the kurma.dev/pod-networks annotation; the rest
// (containers, status, managed fields, labels, other annotations) is
// several times larger. Nothing writes a cached pod back whole (the
// annotation goes out as a patch). Idempotent.
func compactPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	c := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
	if v, ok := p.Annotations[podnet.Annotation]; ok {
		c.Annotations = map[string]string{podnet.Annotation: v}
	}
	return c, nil
}

// Run starts the informers, waits for their caches, and (as leader, when
// a Lease is configured) sets up the project and VPC, runs a full resync
// and the workers until ctx ends. It returns nil on cancellation.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.q.ShutDown()
	w.factory.Start(ctx.Done())
	defer w.factory.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, w.synced...) {
		return ctx.Err()
	}
	if w.cfg.Lease == nil {
		return w.lead(ctx)
	}
	return leader.Run(ctx, w.kube, *w.cfg.Lease, "kurma-k8s-watcher", w.log, w.lead)
}

// Health says why the watcher is not ready, or nil: its informers have
// not synced with the API server, or it leads and has not yet set up the
// cluster's project and VPC with the controller. A standby whose
// informers have synced is ready (it can take over at once).
func (w *Watcher) Health() error {
	for _, s := range w.synced {
		if !s() {
			return errors.New("informers not synced with the API server yet")
		}
	}
	if w.leading.Load() && !w.setUp.Load() {
		return errors.New("leader: setup with the controller not done yet")
	}
	return nil
}

// lead is the leader's part of Run.
func (w *Watcher) lead(ctx context.Context) error {
	w.setUp.Store(false)
	w.leading.Store(true)
	defer w.leading.Store(false)
	if err := w.setup(ctx); err != nil {
		return err
	}
	w.setUp.Store(true)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer w.q.ShutDown()
	for range w.cfg.Workers {
		wg.Go(func() { w.work(ctx) })
	}
	w.q.Add(resyncKey)
	t := time.NewTicker(w.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.q.Add(resyncKey)
		}
	}
}

// setup makes sure the cluster's project and VPC exist, retrying while
// the controller is unavailable.
func (w *Watcher) setup(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		err := w.ensureProjectVPC(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, kerrors.Invalid) || errors.Is(err, kerrors.Unauthorized) || ctx.Err() != nil {
			return fmt.Errorf("watcher: setup: %w", err)
		}
		w.log.Warn("setup failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (w *Watcher) ensureProjectVPC(ctx context.Context) error {
	if _, err := w.c.GetProject(ctx, w.cfg.Project); errors.Is(err, kerrors.NotFound) {
		_, err = w.c.CreateProject(ctx, controllerapi.Project{ID: w.cfg.Project, Name: w.cfg.Project,
			Description: "Kubernetes pods (kurma-k8s-watcher)"})
		if err != nil && !errors.Is(err, kerrors.Conflict) {
			return err
		}
	} else if err != nil {
		return err
	}
	if _, err := w.c.GetVPC(ctx, w.cfg.Project, w.cfg.VPC); errors.Is(err, kerrors.NotFound) {
		_, err = w.c.CreateVPC(ctx, w.cfg.Project, controllerapi.VPC{ID: w.cfg.VPC, Name: w.cfg.VPC,
			CIDR: w.cfg.Pool.Masked().String(), Description: "Kubernetes pod network (flat mode)"})
		if err != nil && !errors.Is(err, kerrors.Conflict) {
			return err
		}
	} else if err != nil {
		return err
	}
	return nil
}

func (w *Watcher) work(ctx context.Context) {
	for {
		key, quit := w.q.Get()
		if quit {
			return
		}
		start := time.Now()
		err := w.sync(ctx, key)
		w.m.observe(key, start, err)
		switch {
		case err == nil || ctx.Err() != nil:
			w.q.Forget(key)
		default:
			w.log.Warn("sync failed; retrying", "key", key, "err", err, "retries", w.q.NumRequeues(key))
			w.q.AddRateLimited(key)
		}
		w.q.Done(key)
	}
}
