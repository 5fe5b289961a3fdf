package kubecluster

import (
	"context"
	"testing"
	"time"
)

// StartT starts a cluster for a test and closes it in t.Cleanup. It skips
// the test when not root and fails it when a build output or host program
// is missing. On failure the daemons' log tails are logged first.
func StartT(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if !isRoot() {
		t.Skip("needs root (make test runs as root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
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
