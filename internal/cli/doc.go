// Package cli is the kurma command line (cobra): it turns podman-like
// commands into calls of the kurmad API client and renders the answers as
// tables or JSON. cmd/kurma/main.go only calls Main.
//
// Exit codes: a propagated command's own code for run and exec; 125 when
// kurma or the daemon fails; 124 when a named pod, app or image does not
// exist (kerrors.NotFound); 130 when interrupted (SIGINT/SIGTERM); 0
// otherwise.
//
// It holds no global state: every command reads its flags from the Options
// built in Main. It must only talk to the daemon through internal/api; it
// must never import the pod manager's or image store's implementations.
package cli
