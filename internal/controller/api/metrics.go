package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	reg     *prometheus.Registry
	latency *prometheus.HistogramVec
}

func newMetrics(core []prometheus.Collector) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kurma_controller_request_duration_seconds",
			Help:    "HTTP request latency by route, method and status code.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5, 30},
		}, []string{"route", "method", "code"}),
	}
	m.reg.MustRegister(m.latency, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(core...)
	return m
}

func (m *metrics) observe(route, method string, code int, d time.Duration) {
	m.latency.WithLabelValues(route, method, strconv.Itoa(code)).Observe(d.Seconds())
}
