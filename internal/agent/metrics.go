package agent

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus metrics (Config.Metrics): how long
// each sync of a key takes and how often it fails, by kind of key (port,
// vpc, guards, lb), how long the datapath takes to plug a port, and how
// many keys wait in the queue. A nil *metrics records nothing.
type metrics struct {
	sync   *prometheus.HistogramVec
	errors *prometheus.CounterVec
	plug   *prometheus.HistogramVec
}

// latencyBuckets span a fast plug (a veth move, ~1 ms) to a slow VPC
// creation under load (seconds).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newMetrics(reg prometheus.Registerer, q *queue) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		sync: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_agent_sync_duration_seconds", Help: "Time to sync one queued key, by kind (port, vpc, guards, lb) and result.",
			Buckets: latencyBuckets,
		}, []string{"kind", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kurma_agent_sync_errors_total", Help: "Syncs that failed and were queued again, by kind of key.",
		}, []string{"kind"}),
		plug: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_agent_port_plug_duration_seconds", Help: "Time the datapath took to plug a port into its pod, by result.",
			Buckets: latencyBuckets,
		}, []string{"result"}),
	}
	reg.MustRegister(m.sync, m.errors, m.plug,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kurma_agent_queue_depth", Help: "Keys waiting to be synced (delayed retries not counted).",
		}, func() float64 { return float64(q.Len()) }))
	return m
}

// keyKinds names the kinds of queue key (agent.go) for the labels.
var keyKinds = map[string]string{"p": "port", "v": "vpc", "g": "guards", "l": "lb"}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// observeSync records one sync of key that started at start.
func (m *metrics) observeSync(key string, start time.Time, err error) {
	if m == nil {
		return
	}
	k, _, _ := strings.Cut(key, "/")
	kind := keyKinds[k]
	if kind == "" {
		kind = "other"
	}
	m.sync.WithLabelValues(kind, result(err)).Observe(time.Since(start).Seconds())
	if err != nil {
		m.errors.WithLabelValues(kind).Inc()
	}
}

// observePlug records one datapath plug that started at start.
func (m *metrics) observePlug(start time.Time, err error) {
	if m == nil {
		return
	}
	m.plug.WithLabelValues(result(err)).Observe(time.Since(start).Seconds())
}
