package watcher

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the watcher's Prometheus metrics (Config.Metrics): how long
// each sync of a key takes and how it ended, by kind of key (pod,
// pod_uid, namespace, resync), and how many keys wait. A nil *metrics
// records nothing.
type metrics struct {
	sync *prometheus.HistogramVec
}

// syncBuckets span a pod whose port exists (one patch, milliseconds) to a
// full resync of a large cluster (seconds).
var syncBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(reg prometheus.Registerer, depth func() int) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{sync: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kurma_k8s_watcher_sync_duration_seconds",
		Help:    "Time to sync one queued key, by kind (pod: port and annotation of a pod; pod_uid: a vanished pod's port; namespace; resync) and result (ok, error: queued again with backoff).",
		Buckets: syncBuckets,
	}, []string{"kind", "result"})}
	reg.MustRegister(m.sync, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kurma_k8s_watcher_queue_depth", Help: "Keys waiting to be synced (delayed retries not counted).",
	}, func() float64 { return float64(depth()) }))
	return m
}

// keyKinds name the kinds of queued keys (their prefix before "/").
var keyKinds = map[string]string{"p": "pod", "n": "namespace", resyncKey: "resync"}

func (m *metrics) observe(key string, start time.Time, err error) {
	if m == nil {
		return
	}
	prefix, _, _ := strings.Cut(key, "/")
	kind, ok := keyKinds[prefix]
	if !ok {
		kind = "other"
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.sync.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
}
