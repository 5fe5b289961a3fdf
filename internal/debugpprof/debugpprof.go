package debugpprof

import (
	"net/http"
	"net/http/pprof"
	"runtime"
)

// Register serves /debug/pprof/ (index and named profiles such as heap
// and goroutine), cmdline, profile, symbol and trace on mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// SampleHeap turns the runtime's heap profiling on or off for the whole
// process. A daemon that does not serve the profiles calls it with false
// as early as it can: the sampled allocations' stacks otherwise fill a
// bucket table of a megabyte or more that nobody reads.
func SampleHeap(on bool) {
	if !on {
		runtime.MemProfileRate = 0
	}
}
