package cnid

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the CNI daemon's Prometheus metrics (Config.Metrics): how
// long each request takes, by command and result, and where an ADD
// spends its time: waiting for the pod's annotation, then for the agent
// to plug the port. A nil *metrics records nothing.
type metrics struct {
	requests *prometheus.HistogramVec
	phases   *prometheus.HistogramVec
}

// buckets span an ADD whose annotation and port are ready (a few ms) to
// one that waits for the annotation under a burst of pods (seconds).
var buckets = []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_cni_request_seconds", Help: "Time to serve one CNI request of the kurma-k8s shim, by command and result.",
			Buckets: buckets,
		}, []string{"command", "result"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kurma_cni_add_phase_seconds",
			Help:    "Phases of a successful CNI ADD: annotation (waiting for the pod's kurma.dev/pod-networks annotation), attach (the agent plugging the port).",
			Buckets: buckets,
		}, []string{"phase"}),
	}
	reg.MustRegister(m.requests, m.phases)
	return m
}

func (m *metrics) observeRequest(cmd string, start time.Time, err error) {
	if m == nil {
		return
	}
	res := "ok"
	if err != nil {
		res = "error"
	}
	m.requests.WithLabelValues(cmd, res).Observe(time.Since(start).Seconds())
}

func (m *metrics) observePhase(phase string, d time.Duration) {
	if m == nil {
		return
	}
	m.phases.WithLabelValues(phase).Observe(d.Seconds())
}
