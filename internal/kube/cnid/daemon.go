package cnid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Agent is what the daemon needs of the node agent; *agent.Agent
// implements it.
type Agent interface {
	Attach(ctx context.Context, portID string, at agent.Attachment) (controllerapi.Port, error)
	Detach(ctx context.Context, portID string) error
	Restore(portID string, at agent.Attachment)
	Synced() <-chan struct{}
	// Plugging reports whether the agent is plugging the port now.
	Plugging(portID string) bool
}

// PolicyGate is what an ADD waits for before the pod is plugged: its
// NetworkPolicy rules in the kernel (internal/kube/netpol's Controller).
type PolicyGate interface {
	WaitPod(ctx context.Context, namespace, name string, ip netip.Addr) error
}

var _ Agent = (*agent.Agent)(nil)

// Config configures a Daemon.
type Config struct {
	Kube     kubernetes.Interface
	NodeName string
	// HostID is the agent's host id; when it differs from NodeName the
	// daemon announces it in the Node's kurma.dev/host-id annotation.
	HostID string
	Agent  Agent
	// Socket is the unix socket the shim dials (default
	// cniwire.DefaultSocket); its directory is made 0700, the socket 0600.
	Socket string
	// StateDir holds the attachment records (required).
	StateDir string
	// AnnotationTimeout and PollInterval bound the wait for a pod's
	// annotation (defaults 10s and 0.5s, seed 002's).
	AnnotationTimeout, PollInterval time.Duration
	// AttachTimeout bounds the agent's plug and UP report (default 30s).
	AttachTimeout time.Duration
	// PlugGrace is how much longer than AttachTimeout an ADD waits while
	// the agent is plugging its port (Agent.Plugging; default 30s): in a
	// burst of pod sandboxes the kernel's RTNL lock can stall every plug
	// for tens of seconds (bench/README.md, stop 32; in one round of stop
	// 31 four ADDs failed at 30s), and an ADD failed in the middle of its
	// plug costs the node a new sandbox, whose namespace and links load
	// the same lock again. The bridge plugin, exec'd per ADD, has no
	// deadline of its own there. The connection's deadline covers both.
	PlugGrace time.Duration
	// MaxConcurrent bounds the requests served at once (default 32).
	MaxConcurrent int
	// DelQueueInterval is how often the DELs the shim queued while the
	// agent was down are carried out, besides at start (default 30s).
	DelQueueInterval time.Duration
	Logger           *slog.Logger
	// Metrics, when set, gets the daemon's Prometheus metrics
	// (metrics.go).
	Metrics prometheus.Registerer
	// Policy, when set, is waited for (up to AttachTimeout) before each
	// ADD plugs its pod: no packet passes before the pod's NetworkPolicy
	// rules are in place.
	Policy PolicyGate
}

// Daemon serves CNI requests. Build it with New; call Restore before the
// agent runs, then Run.
type Daemon struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics // nil without Config.Metrics
	st   store
	pods listersv1.PodLister
	inf  cache.SharedIndexInformer
	fac  informers.SharedInformerFactory

	inflight atomic.Int32 // connections being served

	mu      sync.Mutex                 // guards records, waiters
	records map[string]*record         // by container_ifname
	waiters map[string][]chan struct{} // pod key -> closed on its next event
}

// New checks cfg and builds the pod watch (started by Run).
func New(cfg Config) (*Daemon, error) {
	if cfg.Kube == nil || cfg.Agent == nil || cfg.NodeName == "" || cfg.StateDir == "" {
		return nil, kerrors.New(kerrors.Invalid, "cnid: a Kubernetes client, the agent, a node name and a state dir are required")
	}
	if cfg.HostID == "" {
		cfg.HostID = cfg.NodeName
	}
	if cfg.Socket == "" {
		cfg.Socket = cniwire.DefaultSocket
	}
	if cfg.AnnotationTimeout <= 0 {
		cfg.AnnotationTimeout = 10 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.AttachTimeout <= 0 {
		cfg.AttachTimeout = 30 * time.Second
	}
	if cfg.PlugGrace <= 0 {
		cfg.PlugGrace = 30 * time.Second
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 32
	}
	if cfg.DelQueueInterval <= 0 {
		cfg.DelQueueInterval = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("cnid: state dir: %w", err)
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, m: newMetrics(cfg.Metrics), st: store{cfg.StateDir},
		records: map[string]*record{}, waiters: map[string][]chan struct{}{}}
	d.fac = informers.NewSharedInformerFactoryWithOptions(cfg.Kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		}))
	pi := d.fac.Core().V1().Pods()
	d.inf, d.pods = pi.Informer(), pi.Lister()
	if _, err := d.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { d.wake(o) },
		UpdateFunc: func(_, o any) { d.wake(o) },
	}); err != nil {
		return nil, fmt.Errorf("cnid: %w", err)
	}
	return d, nil
}

// Restore loads the saved attachments and hands them to the agent. Call
// it before the agent's Run.
func (d *Daemon) Restore() {
	recs, errs := d.st.load()
	for _, err := range errs {
		d.log.Warn("cnid: skipping attachment record", "err", err)
	}
	// Of two records holding one port (a sandbox replaced before its DEL),
	// the agent is told about the one whose namespace still exists.
	for _, r := range recs {
		if _, err := os.Stat(r.NetNS); err == nil {
			d.cfg.Agent.Restore(r.PortID, attachment(r))
		}
	}
	d.mu.Lock()
	d.records = recs
	d.mu.Unlock()
	d.log.Info("cnid: attachments restored", "count", len(recs))
}

// wake signals the waiters of a pod's annotation.
func (d *Daemon) wake(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	k := p.Namespace + "/" + p.Name
	d.mu.Lock()
	ws := d.waiters[k]
	delete(d.waiters, k)
	d.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// Run announces the host id, starts the pod watch and serves the socket
// until ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	d.fac.Start(ctx.Done())
	defer d.fac.Shutdown()
	if d.cfg.HostID != d.cfg.NodeName {
		go d.announceHostID(ctx)
	}
	ln, err := listen(d.cfg.Socket)
	if err != nil {
		return err
	}
	d.log.Info("cnid: serving", "socket", d.cfg.Socket, "node", d.cfg.NodeName)
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	sem := make(chan struct{}, d.cfg.MaxConcurrent)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { d.drainDelQueueEvery(ctx, d.cfg.DelQueueInterval) })
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		c, err := ln.Accept()
		if err != nil {
			<-sem
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("cnid: listener closed: %w", err)
			}
			d.log.Warn("cnid: accept", "err", err)
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			d.serve(ctx, c)
		})
	}
}

// listen makes the socket's directory (0700) and the socket (0600),
// replacing a stale socket file.
func listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cnid: socket dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cnid: socket dir: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cnid: stale socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("cnid: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("cnid: socket mode: %w", err)
	}
	return ln, nil
}

func (d *Daemon) serve(ctx context.Context, c net.Conn) {
	accepted := time.Now()
	d.inflight.Add(1)
	defer d.inflight.Add(-1)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d.cfg.AnnotationTimeout + d.cfg.AttachTimeout + d.cfg.PlugGrace + 10*time.Second))
	var req cniwire.Request
	dec := json.NewDecoder(io.LimitReader(c, cniwire.MaxMessage))
	var resp cniwire.Response
	if err := dec.Decode(&req); err != nil {
		resp = errorResponse("", cniError(5, "read request", err.Error()))
	} else {
		resp = d.handle(ctx, &req, accepted, int(d.inflight.Load()))
	}
	_ = json.NewEncoder(c).Encode(&resp)
}

// announceHostID sets the Node's kurma.dev/host-id annotation, retrying
// until it sticks or ctx ends.
func (d *Daemon) announceHostID(ctx context.Context) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{podnet.HostIDAnnotation: d.cfg.HostID}}})
	delay := 200 * time.Millisecond
	for {
		_, err := d.cfg.Kube.CoreV1().Nodes().Patch(ctx, d.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return
		}
		d.log.Warn("cnid: annotate node with host id", "node", d.cfg.NodeName, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// podEvent returns a channel closed at the pod's next watch event.
func (d *Daemon) podEvent(key string) chan struct{} {
	ch := make(chan struct{})
	d.mu.Lock()
	d.waiters[key] = append(d.waiters[key], ch)
	d.mu.Unlock()
	return ch
}

func (d *Daemon) dropPodEvent(key string, ch chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ws := d.waiters[key]
	for i, w := range ws {
		if w == ch {
			d.waiters[key] = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(d.waiters[key]) == 0 {
		delete(d.waiters, key)
	}
}

// getPod reads the pod from the cache, or (at poll ticks, or when the
// cache misses) from the API server.
func (d *Daemon) getPod(ctx context.Context, ns, name string, api bool) (*corev1.Pod, bool, error) {
	if p, err := d.pods.Pods(ns).Get(name); err == nil {
		if !api {
			return p, false, nil
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := d.cfg.Kube.CoreV1().Pods(ns).Get(rctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, true, kerrors.New(kerrors.NotFound, "pod %s/%s not found", ns, name)
	}
	if err != nil {
		return nil, true, fmt.Errorf("get pod %s/%s: %w", ns, name, kerrors.New(kerrors.Unavailable, "%v", err))
	}
	return p, true, nil
}

// Synced reports whether the pod watch has synced with the API server
// (readiness).
func (d *Daemon) Synced() bool { return d.inf.HasSynced() }
