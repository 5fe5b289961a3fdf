package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	reg       *prometheus.Registry
	latency   *prometheus.HistogramVec
	ports     *prometheus.GaugeVec
	upLatency prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kurma_controller_request_duration_seconds",
			Help:    "HTTP request latency by route, method and status code.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 5, 30},
		}, []string{"route", "method", "code"}),
		ports: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kurma_controller_ports",
			Help: "Ports by status, as seen by this replica's change feed.",
		}, []string{"status"}),
		upLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kurma_controller_port_create_to_up_seconds",
			Help:    "Time from port creation to its first UP status.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .5, 1, 5, 30},
		}),
	}
	m.reg.MustRegister(m.latency, m.ports, m.upLatency, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(route, method string, code int, d time.Duration) {
	m.latency.WithLabelValues(route, method, strconv.Itoa(code)).Observe(d.Seconds())
}
