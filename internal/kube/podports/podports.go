package podports

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/kube/ctrl"
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
	SetPortBinding(ctx context.Context, projectID, id, hostID string) (*controllerapi.Port, error)
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

	// wrapQueue, when set, wraps the work queue (tests).
	wrapQueue func(ctrl.Queue) ctrl.Queue
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
	ctl  *ctrl.Controller // queue, lease, workers, metrics, health
	q    ctrl.Queue       // ctl's

	pods   listersv1.PodLister
	podIdx cache.Indexer
	nss    listersv1.NamespaceLister
	nodes  listersv1.NodeLister

	mu      sync.Mutex                       // guards subnets; held while allocating a range
	subnets map[string]*controllerapi.Subnet // by namespace UID

	// wmu guards written: the digest (digestOf) of the annotation last
	// written or found in place, by pod UID, while the pod has a port.
	wmu     sync.Mutex
	written map[types.UID][sha256.Size]byte
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
	w := &Watcher{cfg: cfg, kube: cfg.Kube, c: cfg.Controller, log: cfg.Logger,
		subnets: map[string]*controllerapi.Subnet{}, written: map[types.UID][sha256.Size]byte{}}
	// Informers of their own, no informer resync (the watcher's own full
	// resync covers drift), and no namespace index on pods (nothing here
	// lists pods by namespace).
	podInf := coreinformers.NewPodInformer(cfg.Kube, metav1.NamespaceAll, 0, cache.Indexers{
		uidIndex: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				return []string{string(p.UID)}, nil
			}
			return nil, nil
		}})
	if !cfg.FullPods {
		if err := podInf.SetTransform(compactPod); err != nil {
			return nil, fmt.Errorf("watcher: %w", err)
		}
	}
	nsInf := coreinformers.NewNamespaceInformer(cfg.Kube, 0, cache.Indexers{})
	nodeInf := coreinformers.NewNodeInformer(cfg.Kube, 0, cache.Indexers{})
	w.podIdx = podInf.GetIndexer()
	w.pods = listersv1.NewPodLister(w.podIdx)
	w.nss = listersv1.NewNamespaceLister(nsInf.GetIndexer())
	w.nodes = listersv1.NewNodeLister(nodeInf.GetIndexer())
	ctl, err := ctrl.New(ctrl.Config{
		Name: "kurma-k8s-watcher", Kube: cfg.Kube, Lease: cfg.Lease,
		Informers: []cache.SharedInformer{podInf, nsInf, nodeInf},
		Sync:      w.sync, Setup: w.setup, Workers: cfg.Workers, QPS: 200, Burst: 1000,
		ResyncKey: resyncKey, Resync: cfg.Resync,
		Metrics: cfg.Metrics, MetricsPrefix: "kurma_k8s_watcher", KindOf: keyKind,
		Logger: cfg.Logger, WrapQueue: cfg.wrapQueue,
	})
	if err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	w.ctl, w.q = ctl, ctl.Queue()

	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onPod(o) },
		UpdateFunc: func(_, o any) { w.onPod(o) },
		DeleteFunc: func(o any) { w.onPodDelete(o) },
	}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	if _, err := nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNamespace(o) },
		UpdateFunc: func(_, o any) { w.onNamespace(o) },
		DeleteFunc: func(o any) { w.onNamespace(o) },
	}); err != nil {
		return nil, fmt.Errorf("watcher: %w", err)
	}
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
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
func (w *Watcher) Run(ctx context.Context) error { return w.ctl.Run(ctx) }

// Health says why the watcher is not ready, or nil: its informers have
// not synced with the API server, or it leads and has not yet set up the
// cluster's project and VPC with the controller. A standby whose
// informers have synced is ready (it can take over at once).
func (w *Watcher) Health() error { return w.ctl.Health() }

// Status reports the informers' sync, the leadership and the time of the
// last successful sync.
func (w *Watcher) Status() ctrl.Status { return w.ctl.Status() }

// setup is the leader's first step (ctrl retries it while the controller
// is unavailable): the cluster's project and VPC exist, then a full
// resync is queued.
func (w *Watcher) setup(ctx context.Context) error {
	if err := w.ensureProjectVPC(ctx); err != nil {
		return err
	}
	w.q.Add(resyncKey)
	return nil
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
