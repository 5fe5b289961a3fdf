// Command kurmad is the Kurma daemon: it loads its configuration (defaults
// when none), opens the image store and the pod manager, prefetches images,
// starts the configured initial pods and serves the API (internal/api) on a
// unix socket until SIGTERM or SIGINT. Shutdown leaves pods running — a
// restarted kurmad re-adopts them — unless --stop-pods-on-exit is given.
//
// The pod manager starts stagers through kurma-stage-init beside this
// binary or, where that is missing, by re-executing this binary with the
// hidden first argument stageinit.Arg, which main dispatches before
// anything else.
package main

import (
	"os"

	"kurma.dev/kurma/internal/pod/stageinit"
)

func main() {
	// Must come first: the stager launcher's child may re-execute us (see
	// internal/pod/stageinit).
	if len(os.Args) > 1 && os.Args[1] == stageinit.Arg {
		os.Exit(stageinit.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}
