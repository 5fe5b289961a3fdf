package kubecluster

import (
	"testing"
)

// StartT starts a cluster for a test and closes it in t.Cleanup. It skips
// the test when not root and fails it when a build output or host program
// is missing. On failure the daemons' log tails are logged first.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if !isRoot() {
		t.Skip("needs root (make test runs as root)")
	}
	// No deadline of its own: the wait for the host lock is bounded by
	// the test's, and each startup step has its own.
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Processes() {
				t.Logf("--- %s (tail) ---\n%s", p.Name, c.Logs(p.Name, 3000))
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	return c
}
