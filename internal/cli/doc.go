// Package cli is the kurma command line (cobra): it turns podman-like
// commands into calls of the kurmad API client and renders the answers as
// tables or JSON. cmd/kurma/main.go only calls Main.
//
// Exit codes, as docker's and podman's: a propagated command's own code for
// run and exec; 125 when kurma or the daemon fails (a named pod, app or
// image that does not exist included); 126 when an app's command cannot be
// executed (not executable, no such working directory) and 127 when it does
// not exist; 130 when interrupted (SIGINT/SIGTERM); 0 otherwise.
//
// It holds no global state: every command reads its flags from the Options
// built in Main. It talks to the daemon only through the API client.
// Must not depend on: `net/http`, `kurma.dev/kurma/internal/api`,
// `kurma.dev/kurma/internal/pod`, `kurma.dev/kurma/internal/image`,
// `kurma.dev/kurma/internal/stager`.
package cli
