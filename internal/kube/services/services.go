package services

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"kurma.dev/kurma/internal/kube/ctrl"
	"kurma.dev/kurma/internal/kube/leader"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// ErrLostLease ends Run when another replica took the lease.
var ErrLostLease = leader.ErrLost

// Controller is the part of the controller API the reconciler uses;
// *controllerapi.Client implements it.
type Controller interface {
	GetVPC(ctx context.Context, projectID, id string) (*controllerapi.VPC, error)
	GetSubnet(ctx context.Context, projectID, id string) (*controllerapi.Subnet, error)
	CreateSubnet(ctx context.Context, projectID string, s controllerapi.Subnet) (*controllerapi.Subnet, error)
	ListSubnets(ctx context.Context, projectID, networkID string) ([]controllerapi.Subnet, error)
	DeleteSubnet(ctx context.Context, projectID, id string) error
	EachLoadBalancer(ctx context.Context, projectID string, fn func(*controllerapi.LoadBalancer) error) error
	GetLoadBalancer(ctx context.Context, projectID, id string) (*controllerapi.LoadBalancer, error)
	CreateLoadBalancer(ctx context.Context, projectID string, lb controllerapi.LoadBalancer) (*controllerapi.LoadBalancer, error)
	UpdateLoadBalancer(ctx context.Context, projectID, id string, u controllerapi.LoadBalancerUpdate) (*controllerapi.LoadBalancer, error)
	SetMembers(ctx context.Context, projectID, id string, members []controllerapi.Member) (*controllerapi.LoadBalancer, error)
	DeleteLoadBalancer(ctx context.Context, projectID, id string) error
	GetExternalNetwork(ctx context.Context, id string) (*controllerapi.ExternalNetwork, error)
	ListFloatingIPs(ctx context.Context, projectID string) ([]controllerapi.FloatingIP, error)
	GetFloatingIP(ctx context.Context, projectID, id string) (*controllerapi.FloatingIP, error)
	CreateFloatingIP(ctx context.Context, projectID string, f controllerapi.FloatingIP) (*controllerapi.FloatingIP, error)
	AssociateFloatingIP(ctx context.Context, projectID, id string, a controllerapi.FloatingIPAssociation) (*controllerapi.FloatingIP, error)
	DeleteFloatingIP(ctx context.Context, projectID, id string) error
}

var _ Controller = (*controllerapi.Client)(nil)

// Lease configures leader election on a coordination.k8s.io Lease (as
// internal/kube/podports's, on a Lease of its own).
type Lease = leader.Lease

// DefaultClass is the loadBalancerClass this package serves (besides
// Services that name no class).
const DefaultClass = "kurma.dev/floating-ip"

// Config configures a Reconciler.
type Config struct {
	Kube       kubernetes.Interface
	Controller Controller
	// Project and VPC are the cluster's controller project and VPC (made
	// by internal/kube/podports; the reconciler waits for the VPC).
	// Defaults "k8s" and "k8s-pods".
	Project, VPC string
	// ServiceCIDR is the API server's --service-cluster-ip-range
	// (required). ServiceSubnet is the id of the service subnet that
	// covers it (default "k8s-services"), created when missing.
	ServiceCIDR   netip.Prefix
	ServiceSubnet string
	// ExternalNetwork is the id of the external network floating IPs come
	// from (default "public"). When it does not exist, ClusterIPs keep
	// working and every LoadBalancer Service gets a Warning Event.
	ExternalNetwork string
	// Class is the loadBalancerClass served besides unset
	// (DefaultClass when empty).
	Class string
	// Workers is the number of Services synced in parallel (default 8).
	Workers int
	// Coalesce is how long a changed Service waits before its sync, so
	// that a burst of events is synced once (default 2ms).
	Coalesce time.Duration
	// Resync is the period of the full resync (default 60s).
	Resync time.Duration
	Lease  *Lease
	// Metrics, when set, receives the reconciler's Prometheus metrics
	// (kurma_k8s_services_*, docs/kubernetes.md).
	Metrics prometheus.Registerer
	Logger  *slog.Logger

	// wrapQueue, when set, wraps the work queue (tests).
	wrapQueue func(ctrl.Queue) ctrl.Queue
}

// Reconciler keeps one load balancer (and floating IP) per Service. Build
// it with New and call Run once.
type Reconciler struct {
	cfg  Config
	kube kubernetes.Interface
	c    Controller
	log  *slog.Logger
	ctl  *ctrl.Controller // queue, lease, workers, metrics, health
	q    ctrl.Queue       // ctl's
	rec  record.EventRecorder
	bc   record.EventBroadcaster

	svcInf   cache.SharedIndexInformer
	sliceInf cache.SharedIndexInformer
	cidrInf  cache.SharedIndexInformer // ServiceCIDRs; nil when the API server has none (servicecidr.go)
	nodeInf  cache.SharedIndexInformer // *nodeObj: a node's host id
	svcIdx   cache.Indexer             // *svcObj by namespace/name
	sliceIdx cache.Store               // *sliceObj by namespace/name

	// slicesBy: the keys of each Service's slices (Service key -> slice
	// keys), kept by the slice handlers; a plain map is a fraction of an
	// informer index's per-slice cost.
	sliceMu  sync.Mutex
	slicesBy map[string][]string // guarded by sliceMu

	mu sync.Mutex
	// lbs: by Service key, the load balancer the controller last
	// returned for it (one entry per Service: no separate id index).
	lbs    map[string]lbEntry                   // guarded by mu
	fips   map[string]*controllerapi.FloatingIP // guarded by mu; by id
	warned map[types.UID]bool                   // guarded by mu; Services told the external network is missing
	extOK  bool                                 // guarded by mu; the external network exists
	// extSaid: the absence of the external network was logged; it is
	// logged again only after it was found (guarded by mu).
	extSaid bool
	// waitIP: Services whose loadBalancerIP was taken, by address; they
	// are synced again when a floating IP with that address is released.
	waitIP map[string]map[string]bool // guarded by mu
	// vpcPrefix holds every member address the controller accepts;
	// guarded by mu, set by setup before the workers start.
	vpcPrefix netip.Prefix
	// added: the ranges of ServiceCIDRs served besides the configured
	// one, by object name (guarded by mu); rangesPtr publishes them with
	// it for lock-free reads (servicecidr.go).
	added     map[string]svcRange
	rangesPtr atomic.Pointer[rangeSet]
}

const (
	resyncKey = "\x00resync"
)

// New checks cfg and builds the informers (started by Run).
func New(cfg Config) (*Reconciler, error) {
	if cfg.Kube == nil || cfg.Controller == nil {
		return nil, kerrors.New(kerrors.Invalid, "services: a Kubernetes client and a controller client are required")
	}
	if !cfg.ServiceCIDR.IsValid() {
		return nil, kerrors.New(kerrors.Invalid, "services: the service CIDR (--service-cluster-ip-range) is required")
	}
	cfg.ServiceCIDR = cfg.ServiceCIDR.Masked()
	if cfg.Project == "" {
		cfg.Project = "k8s"
	}
	if cfg.VPC == "" {
		cfg.VPC = "k8s-pods"
	}
	if cfg.ServiceSubnet == "" {
		cfg.ServiceSubnet = "k8s-services"
	}
	if cfg.ExternalNetwork == "" {
		cfg.ExternalNetwork = "public"
	}
	if cfg.Class == "" {
		cfg.Class = DefaultClass
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Coalesce <= 0 {
		cfg.Coalesce = 2 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Reconciler{
		cfg: cfg, kube: cfg.Kube, c: cfg.Controller, log: cfg.Logger,
		lbs: map[string]lbEntry{}, fips: map[string]*controllerapi.FloatingIP{},
		warned: map[types.UID]bool{},
		waitIP: map[string]map[string]bool{}, slicesBy: map[string][]string{},
		added: map[string]svcRange{},
	}
	// Informers of their own, without the namespace index a factory adds
	// (nothing here lists by namespace), caching compact records of the
	// fields the reconciler reads (transforms.go): at 10,000 Services the
	// caches are most of this process's memory.
	svcInf := coreinformers.NewServiceInformer(cfg.Kube, metav1.NamespaceAll, 0, cache.Indexers{})
	sliceInf := discoveryinformers.NewEndpointSliceInformer(cfg.Kube, metav1.NamespaceAll, 0, cache.Indexers{})
	if err := svcInf.SetTransform(compactService); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	if err := sliceInf.SetTransform(compactSlice); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	// Nodes: only to map an endpoint's node to its agent's host id.
	nodeInf := coreinformers.NewNodeInformer(cfg.Kube, 0, cache.Indexers{})
	if err := nodeInf.SetTransform(compactNode); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	r.svcInf, r.sliceInf, r.nodeInf = svcInf, sliceInf, nodeInf
	r.svcIdx, r.sliceIdx = svcInf.GetIndexer(), sliceInf.GetIndexer()
	infs := []cache.SharedInformer{svcInf, sliceInf, nodeInf}
	{
		// ServiceCIDRs: networking.k8s.io/v1, served since v1.33.
		r.cidrInf = networkinginformers.NewServiceCIDRInformer(cfg.Kube, 0, cache.Indexers{})
		infs = append(infs, r.cidrInf)
		enqueueCIDR := func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
				r.q.Add(cidrKeyPrefix + sc.Name)
			}
		}
		if _, err := r.cidrInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: enqueueCIDR, UpdateFunc: func(_, o any) { enqueueCIDR(o) }, DeleteFunc: enqueueCIDR,
		}); err != nil {
			return nil, fmt.Errorf("services: %w", err)
		}
	}
	ctl, err := ctrl.New(ctrl.Config{
		Name: "kurma-k8s-services", Kube: cfg.Kube, Lease: cfg.Lease,
		Informers: infs,
		Sync:      r.syncKey, Setup: r.setup, Workers: cfg.Workers, QPS: 1000, Burst: 5000,
		ResyncKey: resyncKey, Resync: cfg.Resync,
		Metrics: cfg.Metrics, MetricsPrefix: "kurma_k8s_services", KindOf: keyKind,
		Logger: cfg.Logger, WrapQueue: cfg.wrapQueue,
	})
	if err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	r.ctl, r.q = ctl, ctl.Queue()
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.nodeChanged(nil, nodeOf(o)) },
		UpdateFunc: func(old, o any) { r.nodeChanged(nodeOf(old), nodeOf(o)) },
		DeleteFunc: func(o any) { r.nodeChanged(nodeOf(o), nil) },
	}); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	enqueueSvc := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if s, ok := o.(*svcObj); ok {
			r.enqueue(s.key())
		}
	}
	// sliceOf unwraps a tombstone.
	sliceOf := func(o any) *sliceObj {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		s, _ := o.(*sliceObj)
		return s
	}
	if _, err := svcInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueSvc, UpdateFunc: func(_, o any) { enqueueSvc(o) }, DeleteFunc: enqueueSvc,
	}); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	if _, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { r.sliceMoved(nil, sliceOf(o)) },
		UpdateFunc: func(old, o any) {
			// A slice that moved to another Service updates both.
			r.sliceMoved(sliceOf(old), sliceOf(o))
		},
		DeleteFunc: func(o any) { r.sliceMoved(sliceOf(o), nil) },
	}); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	r.bc = record.NewBroadcaster()
	r.rec = r.bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kurma-k8s-services"})
	return r, nil
}

// sliceMoved records that a slice left the Service of old and joined the
// Service of cur (nil: none) and enqueues both.
func (r *Reconciler) sliceMoved(old, cur *sliceObj) {
	var from, to, key string
	if old != nil && old.service != "" {
		from, key = old.ns+"/"+old.service, old.key()
	}
	if cur != nil && cur.service != "" {
		to, key = cur.ns+"/"+cur.service, cur.key()
	}
	r.sliceMu.Lock()
	if from != "" && from != to {
		ks := slices.DeleteFunc(r.slicesBy[from], func(k string) bool { return k == key })
		if len(ks) == 0 {
			delete(r.slicesBy, from)
		} else {
			r.slicesBy[from] = slices.Clip(ks)
		}
	}
	if to != "" && !slices.Contains(r.slicesBy[to], key) {
		r.slicesBy[to] = append(slices.Clip(r.slicesBy[to]), key)
	}
	r.sliceMu.Unlock()
	if from != "" {
		r.enqueue(from)
	}
	if to != "" && to != from {
		r.enqueue(to)
	}
}

// hostOf is the host id of a node's agent: the node's kurma.dev/host-id
// annotation, else its name.
func (r *Reconciler) hostOf(node string) string {
	if o, ok, _ := r.nodeInf.GetStore().GetByKey(node); ok {
		if n, ok := o.(*nodeObj); ok && n.hostID != "" {
			return n.hostID
		}
	}
	return node
}

// nodeChanged resyncs every Service when a node's host id differs from
// its name and changed (rare: members name hosts by id).
func (r *Reconciler) nodeChanged(old, cur *nodeObj) {
	id := func(n *nodeObj) string {
		if n == nil || n.hostID == "" {
			return ""
		}
		return n.hostID
	}
	if id(old) == id(cur) {
		return
	}
	for _, k := range r.svcIdx.ListKeys() {
		r.enqueue(k)
	}
}

// enqueue schedules a Service's sync after the coalescing window: the
// delaying queue keeps one entry per key, so the events of a burst are
// synced once.
func (r *Reconciler) enqueue(key string) { r.q.AddAfter(key, r.cfg.Coalesce) }

// Run starts the informers, waits for their caches and (as leader, when a
// Lease is configured) makes sure the service subnet exists, runs a full
// resync and the workers until ctx ends. It returns nil on cancellation.
func (r *Reconciler) Run(ctx context.Context) error {
	// Events go out only from the leader's syncs; a standby records none.
	r.bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.kube.CoreV1().Events("")})
	defer r.bc.Shutdown()
	return r.ctl.Run(ctx)
}

// syncKey syncs one queued key: the resync or a Service's namespace/name.
func (r *Reconciler) syncKey(ctx context.Context, key string) error {
	if key == resyncKey {
		return r.resync(ctx)
	}
	if name, ok := strings.CutPrefix(key, cidrKeyPrefix); ok {
		return r.syncCIDR(ctx, name)
	}
	return r.sync(ctx, key)
}

// keyKind names a key's kind in kurma_k8s_services_sync_duration_seconds.
func keyKind(key string) string {
	if key == resyncKey {
		return "resync"
	}
	if strings.HasPrefix(key, cidrKeyPrefix) {
		return "servicecidr"
	}
	return "service"
}

// Synced reports whether the leader's setup and first resync have
// finished (for tests and readiness).
func (r *Reconciler) Synced() bool { return r.ctl.Status().SetUp }

// Health says why the reconciler is not ready, or nil: its informers
// have not synced with the API server, or it leads and its first resync
// with the controller has not finished. A synced standby is ready.
func (r *Reconciler) Health() error { return r.ctl.Health() }

// Status reports the informers' sync, the leadership and the time of the
// last successful sync.
func (r *Reconciler) Status() ctrl.Status { return r.ctl.Status() }
