package ctrl

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsRegisterer is where the controller registers its metrics.
type MetricsRegisterer = prometheus.Registerer

// metrics are a controller's Prometheus metrics; a nil *metrics records
// nothing.
type metrics struct {
	sync *prometheus.HistogramVec
}

// syncBuckets span a key whose object is already right (one call,
// milliseconds) to a full resync of a large cluster (seconds).
var syncBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newMetrics(reg prometheus.Registerer, prefix string, c *Controller) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	if prefix == "" {
		return nil, fmt.Errorf("metrics need a prefix")
	}
	m := &metrics{sync: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "_sync_duration_seconds",
		Help:    "Time to sync one queued key, by kind of key and result (ok, error: queued again with backoff).",
		Buckets: syncBuckets,
	}, []string{"kind", "result"})}
	cs := []prometheus.Collector{m.sync,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: prefix + "_queue_depth", Help: "Keys waiting to be synced (delayed retries not counted).",
		}, func() float64 { return float64(c.q.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: prefix + "_leader", Help: "1 while this replica leads and its workers run, else 0.",
		}, func() float64 {
			if c.leading.Load() && c.setUp.Load() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: prefix + "_last_success_timestamp_seconds", Help: "Unix time of the end of the last successful sync of a key (0: none yet).",
		}, func() float64 { return float64(c.lastSuccess.Load()) / 1e9 }),
	}
	for _, col := range cs {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(kind string, start time.Time, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.sync.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
}
