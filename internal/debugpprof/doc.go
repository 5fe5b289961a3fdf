// Package debugpprof puts Go's profiling handlers (net/http/pprof) on a
// daemon's own mux, for operators who turn them on with a flag: the
// agent's --pprof (on its metrics listener) and kurma-k8s-watcher's
// --debug-listen. They are off by default, and SampleHeap turns the
// runtime's heap sampling off while they are. (Importing net/http/pprof also
// registers them on http.DefaultServeMux, which no Kurma daemon serves.)
// It imports only the standard library.
package debugpprof
