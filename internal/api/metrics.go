package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// apiMetrics time every request by route (the mux pattern) and status,
// and count the ones that failed.
type apiMetrics struct {
	latency *prometheus.HistogramVec
	errors  *prometheus.CounterVec
}

func newAPIMetrics(reg prometheus.Registerer) *apiMetrics {
	m := &apiMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kurma_api_request_duration_seconds", Help: "Time to answer an API request, by route and status code (streams: until they end).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kurma_api_errors_total", Help: "API requests answered with an error status, by route and status code.",
		}, []string{"route", "code"}),
	}
	reg.MustRegister(m.latency, m.errors)
	return m
}

// statusWriter remembers the status code a handler wrote. It passes
// Flush and Hijack (streams, exec upgrades) through Unwrap.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush lets the streaming handlers flush through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// instrument serves r with the mux and records it.
func (s *Server) instrument(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	s.mux.ServeHTTP(sw, r)
	route := r.Pattern // set by the mux on the request it matched
	if route == "" || route == "/" {
		route = "other"
	}
	code := sw.code
	if code == 0 {
		code = http.StatusOK
	}
	c := strconv.Itoa(code)
	s.metrics.latency.WithLabelValues(route, c).Observe(time.Since(start).Seconds())
	if code >= 400 {
		s.metrics.errors.WithLabelValues(route, c).Inc()
	}
}

// metricsHandler serves the registry's metrics (GET /metrics).
func metricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
