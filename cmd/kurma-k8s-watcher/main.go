// Command kurma-k8s-watcher turns Kubernetes pods into Kurma controller
// ports (see internal/kube/podports): one subnet per namespace, one port
// per scheduled pod, its details in the pod's kurma.dev/pod-networks
// annotation. Run two replicas with --leader-elect; only the lease holder
// writes.
//
// It exits 0 on SIGTERM/SIGINT (releasing its lease) and 1 when it loses
// the lease, so that its supervisor restarts it as a follower.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kurma.dev/kurma/internal/debugpprof"
	"kurma.dev/kurma/internal/gcflag"
	"kurma.dev/kurma/internal/kube/podports"
	"kurma.dev/kurma/internal/kube/services"
	"kurma.dev/kurma/pkg/controllerapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kurma-k8s-watcher:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		kubeconfig    = flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster config)")
		controllerURL = flag.String("controller", "http://127.0.0.1:9696", "Kurma controller base URL")
		tokenFile     = flag.String("token-file", "", "file holding the controller's bearer token")
		project       = flag.String("project", "k8s", "controller project id of the cluster")
		vpc           = flag.String("vpc", "k8s-pods", "controller VPC id of the cluster")
		pool          = flag.String("pool", "10.32.0.0/11", "address pool namespace subnets are cut from")
		subnetBits    = flag.Int("subnet-bits", 16, "prefix length of each namespace's subnet")
		workers       = flag.Int("workers", 8, "keys synced in parallel")
		resync        = flag.Duration("resync", time.Minute, "period of the full resync")
		leaderElect   = flag.Bool("leader-elect", false, "elect a leader on a Lease (run 2 replicas)")
		leaseNS       = flag.String("lease-namespace", "kube-system", "namespace of the leader Lease")
		leaseName     = flag.String("lease-name", "kurma-k8s-watcher", "name of the leader Lease")
		identity      = flag.String("identity", "", "this replica's identity in the Lease (default: $POD_NAME, else the hostname)")
		leaseDuration = flag.Duration("lease-duration", 12*time.Second, "Lease duration (a dead leader is replaced after at most this + retry period)")
		serviceCIDR   = flag.String("service-cidr", "", "the API server's --service-cluster-ip-range; set, Services become load balancers (internal/kube/services)")
		svcSubnet     = flag.String("service-subnet", "k8s-services", "controller id of the service subnet covering --service-cidr (created when missing)")
		extNet        = flag.String("external-network", "public", "controller external network floating IPs of LoadBalancer Services come from")
		lbClass       = flag.String("load-balancer-class", "kurma.dev/floating-ip", "loadBalancerClass served besides unset")
		svcLease      = flag.String("services-lease-name", "kurma-k8s-services", "name of the Services reconciler's leader Lease")
		debugListen   = flag.String("debug-listen", "", "address serving Go's /debug/pprof/ (empty: none; profiles reveal internals, keep it local)")
		metricsListen = flag.String("metrics-listen", "127.0.0.1:9698", "address serving GET /metrics (Prometheus) and GET /healthz (empty: none; an address in use is logged, not fatal)")
		verbose       = flag.Bool("v", false, "debug logging")
		fullPods      = flag.Bool("cache-full-pods", false, "cache whole Pod objects instead of compact ones (bench/k8s/watcherrss's baseline only)")
	)
	gcPercent := gcflag.Register(flag.CommandLine)
	flag.Parse()
	debugpprof.SampleHeap(*debugListen != "")
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	gc, gcFrom, err := gcPercent.Apply()
	if err != nil {
		return err
	}
	log.Info("go gc target", "gc_percent", gc, "from", gcFrom)

	pfx, err := netip.ParsePrefix(*pool)
	if err != nil {
		return fmt.Errorf("--pool %q: %w", *pool, err)
	}
	var rc *rest.Config
	if *kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	rc.QPS, rc.Burst = 200, 400
	// Protobuf, as the agent, kube-proxy and the kubelet use: the watcher
	// reads built-in types only, and its cold start lists every Service,
	// EndpointSlice, Pod and Node of the cluster.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var opts []controllerapi.Option
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, controllerapi.WithToken(strings.TrimSpace(string(b))))
	}
	ctl, err := controllerapi.New(*controllerURL, opts...)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := podports.Config{Kube: kc, Controller: ctl, Project: *project, VPC: *vpc, Pool: pfx,
		SubnetBits: *subnetBits, Workers: *workers, Resync: *resync, Metrics: reg, Logger: log,
		FullPods: *fullPods}
	if *leaderElect {
		id := *identity
		if id == "" {
			id = os.Getenv("POD_NAME")
		}
		if id == "" {
			if id, err = os.Hostname(); err != nil {
				return fmt.Errorf("--identity not given and no hostname: %w", err)
			}
		}
		d := *leaseDuration
		cfg.Lease = &podports.Lease{Namespace: *leaseNS, Name: *leaseName, Identity: id,
			Duration: d, RenewDeadline: d * 2 / 3, RetryPeriod: max(d/6, time.Second)}
	}
	w, err := podports.New(cfg)
	if err != nil {
		return err
	}
	var svc *services.Reconciler
	if *serviceCIDR != "" {
		sp, err := netip.ParsePrefix(*serviceCIDR)
		if err != nil {
			return fmt.Errorf("--service-cidr %q: %w", *serviceCIDR, err)
		}
		scfg := services.Config{Kube: kc, Controller: ctl, Project: *project, VPC: *vpc, ServiceCIDR: sp,
			ServiceSubnet: *svcSubnet, ExternalNetwork: *extNet, Class: *lbClass, Workers: *workers,
			Resync: *resync, Metrics: reg, Logger: log}
		if cfg.Lease != nil {
			l := *cfg.Lease
			scfg.Lease = &services.Lease{Namespace: l.Namespace, Name: *svcLease, Identity: l.Identity,
				Duration: l.Duration, RenewDeadline: l.RenewDeadline, RetryPeriod: l.RetryPeriod}
		}
		if svc, err = services.New(scfg); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *debugListen != "" {
		mux := http.NewServeMux()
		debugpprof.Register(mux)
		if err := serve(ctx, *debugListen, mux, log); err != nil {
			return fmt.Errorf("--debug-listen: %w", err)
		}
	}
	if *metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// /healthz is readiness: informers synced and, when leading,
		// set up with the controller; its body also gives each
		// controller's state and the time of its last successful sync.
		// /livez: the process serves.
		mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
			err := w.Health()
			status := "pods: " + w.Status().String() + "\n"
			if svc != nil {
				if err == nil {
					err = svc.Health()
				}
				status += "services: " + svc.Status().String() + "\n"
			}
			if err != nil {
				http.Error(rw, err.Error()+"\n"+status, http.StatusServiceUnavailable)
				return
			}
			_, _ = rw.Write([]byte("ok\n" + status))
		})
		mux.HandleFunc("GET /livez", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
		if err := serve(ctx, *metricsListen, mux, log); err != nil {
			// Another replica's metrics on this host's address: the
			// network matters more than its figures.
			log.Error("metrics not served", "addr", *metricsListen, "err", err)
		}
	}
	log.Info("kurma-k8s-watcher starting", "controller", *controllerURL, "project", *project, "vpc", *vpc,
		"pool", pfx, "leader_elect", *leaderElect, "service_cidr", *serviceCIDR)
	err = runBoth(ctx, w.Run, svc)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	log.Info("kurma-k8s-watcher stopped", "err", err)
	return err
}

// serve serves mux on addr until ctx ends.
func serve(ctx context.Context, addr string, mux *http.ServeMux, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "addr", addr, "err", err)
		}
	}()
	log.Info("listening", "addr", l.Addr().String())
	return nil
}

// runBoth runs the pod watcher and, when configured, the Services
// reconciler until ctx ends or either returns; the first error wins and
// stops the other.
func runBoth(ctx context.Context, pods func(context.Context) error, svc *services.Reconciler) error {
	if svc == nil {
		return pods(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- pods(ctx) }()
	go func() { errs <- svc.Run(ctx) }()
	first := <-errs
	cancel()
	second := <-errs
	if first != nil {
		return first
	}
	return second
}
