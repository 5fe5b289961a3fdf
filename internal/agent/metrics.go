package agent

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus metrics (Config.Metrics): how long
// each sync of a key takes and how often it fails, by kind of key (port,
// vpc, guards, lb), how long the datapath takes to plug a port, and how
// many keys wait in the queue, and how many periodic resyncs ran. A nil
// *metrics records nothing.
type metrics struct {
	sync   *prometheus.HistogramVec
	errors *prometheus.CounterVec
	plug   *prometheus.HistogramVec
	wait   *prometheus.HistogramVec // queue wait by kind of key
	attach *prometheus.HistogramVec // Attach phases
}

// latencyBuckets span a fast plug (a veth move, ~1 ms) to a slow VPC
// creation under load (seconds).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newMetrics(reg prometheus.Registerer, q *queue, resyncs func() float64) *metrics {
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
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_agent_queue_wait_seconds", Help: "Time a key waited in the queue before a worker took it, by kind (port, vpc, guards, lb) and urgency (a CNI ADD or DEL waits on an urgent key).",
			Buckets: latencyBuckets,
		}, []string{"kind", "urgent"}),
		attach: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_agent_attach_seconds",
			Help: "Phases of an Attach (a Kubernetes ADD's plug): port_wait, until the controller's feed has delivered the port (0 when it already had); " +
				"plugged, from the call until the port is plugged; by phase.",
			Buckets: latencyBuckets,
		}, []string{"phase"}),
	}
	reg.MustRegister(m.sync, m.errors, m.plug, m.wait, m.attach,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kurma_agent_queue_depth", Help: "Keys waiting to be synced (delayed retries not counted).",
		}, func() float64 { return float64(q.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kurma_agent_resyncs_total", Help: "Periodic full level checks queued since the agent started.",
		}, resyncs))
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

func kindOf(key string) string {
	k, _, _ := strings.Cut(key, "/")
	if kind := keyKinds[k]; kind != "" {
		return kind
	}
	return "other"
}

// observeWait records how long key waited in the queue.
func (m *metrics) observeWait(key string, waited time.Duration, urgent bool) {
	if m == nil {
		return
	}
	m.wait.WithLabelValues(kindOf(key), strconv.FormatBool(urgent)).Observe(waited.Seconds())
}

// observeAttach records one phase of an Attach.
func (m *metrics) observeAttach(phase string, d time.Duration) {
	if m == nil {
		return
	}
	m.attach.WithLabelValues(phase).Observe(d.Seconds())
}

// observeSync records one sync of key that started at start.
func (m *metrics) observeSync(key string, start time.Time, err error) {
	if m == nil {
		return
	}
	kind := kindOf(key)
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
