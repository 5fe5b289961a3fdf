package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kurma.dev/kurma/internal/pod"
)

// daemonMetrics are kurmad's own Prometheus metrics (the API adds its
// request metrics to the same registry): the pod start's phases and
// outcome, and the number of pods.
type daemonMetrics struct {
	reg    *prometheus.Registry
	steps  *prometheus.HistogramVec
	starts *prometheus.CounterVec
}

func newDaemonMetrics() *daemonMetrics {
	m := &daemonMetrics{
		reg: prometheus.NewRegistry(),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kurma_pod_start_step_duration_seconds",
			Help:    "Time each pod start step took (images, dirs, rootfs, manifest, cgroups, launch, netns, network, start, ready; total for the whole start), by result.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"step", "result"}),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kurma_pod_starts_total", Help: "Pod starts, by result (ok, error).",
		}, []string{"result"}),
	}
	m.reg.MustRegister(m.steps, m.starts, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeStep is pod.Options.ObserveStep.
func (m *daemonMetrics) observeStep(step string, took time.Duration, err error) {
	res := "ok"
	if err != nil {
		res = "error"
	}
	m.steps.WithLabelValues(step, res).Observe(took.Seconds())
	if step == pod.StepTotal {
		m.starts.WithLabelValues(res).Inc()
	}
}

// watchPods registers a gauge of the pods the manager holds.
func (m *daemonMetrics) watchPods(mgr pod.Manager) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kurma_pods", Help: "Pods kurmad holds, in any state.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ps, err := mgr.List(ctx)
		if err != nil {
			return -1
		}
		return float64(len(ps))
	}))
}

// serveTCP serves GET /metrics and GET /healthz on addr (--metrics-listen)
// until ctx ends; the API socket serves both as well.
func (m *daemonMetrics) serveTCP(ctx context.Context, addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("metrics listening", "addr", l.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	return nil
}
