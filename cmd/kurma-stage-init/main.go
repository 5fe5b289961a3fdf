// Command kurma-stage-init is the first process of every pod, started by
// kurmad in the pod's new namespaces as `kurma-stage-init stage-init
// <json>` (or `... stage-init -spare`, a warm spare). It sets up the
// stager's root and execs the stager; see internal/pod/stageinit.
//
// It is a binary of its own, apart from kurmad, only to start fast: it
// links nothing but the stageinit package.
package main

import (
	"fmt"
	"os"

	"kurma.dev/kurma/internal/pod/stageinit"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != stageinit.Arg {
		fmt.Fprintf(os.Stderr, "kurma-stage-init is started by kurmad, as: %s %s CONFIG\n", os.Args[0], stageinit.Arg)
		os.Exit(2)
	}
	os.Exit(stageinit.Main(os.Args[2:]))
}
