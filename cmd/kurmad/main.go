// Command kurmad is the Kurma daemon: it loads its configuration (defaults
// when none), opens the image store and the pod manager, prefetches images,
// starts the configured initial pods and serves the API (internal/api) on a
// unix socket until SIGTERM or SIGINT. Shutdown leaves pods running — a
// restarted kurmad re-adopts them — unless --stop-pods-on-exit is given.
//
// The pod manager starts stagers by re-executing this binary with the hidden
// first argument pod.StageInitArg; main dispatches it before anything else.
package main

import (
	"os"

	"kurma.dev/kurma/internal/pod"
)

func main() {
	// Must come first: the stager launcher's child re-executes us (see
	// internal/pod/stageinit.go).
	if len(os.Args) > 1 && os.Args[1] == pod.StageInitArg {
		os.Exit(pod.StageInit(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}
