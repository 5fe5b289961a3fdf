package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestManifestsDryRun applies every manifest with a server-side dry-run:
// the API server validates them (schemas, RBAC rules, references) and
// stores nothing.
func TestManifestsDryRun(t *testing.T) {
	c := kubecluster.StartT(t, kubecluster.Options{NoNode: true})
	dir := filepath.Join(testutil.RepoRoot(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("manifests: %v, %v", files, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := c.Kubectl(ctx, "apply", "--dry-run=server", "-f", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"configmap/kurma-config", "serviceaccount/kurma-k8s-watcher", "clusterrole.rbac.authorization.k8s.io/kurma-k8s-watcher",
		"role.rbac.authorization.k8s.io/kurma-k8s-watcher-lease", "deployment.apps/kurma-k8s-watcher",
		"serviceaccount/kurma-agent", "clusterrole.rbac.authorization.k8s.io/kurma-agent", "daemonset.apps/kurma-agent",
		"deployment.apps/kurma-controller",
	} {
		if !strings.Contains(out, want+" created (server dry run)") {
			t.Errorf("dry-run output lacks %s:\n%s", want, out)
		}
	}
	// Nothing was stored.
	if got, err := c.Kubectl(ctx, "get", "deployments,daemonsets", "-n", "kube-system", "-o", "name"); err != nil || strings.Contains(got, "kurma") {
		t.Fatalf("dry-run stored objects: %q, %v", got, err)
	}
	// The uninstall DaemonSet is valid too.
	if out, err := c.Kubectl(ctx, "apply", "--dry-run=server", "-f", filepath.Join(dir, "uninstall")); err != nil ||
		!strings.Contains(out, "daemonset.apps/kurma-uninstall created (server dry run)") {
		t.Fatalf("uninstall dry-run: %v\n%s", err, out)
	}
	// A broken manifest is refused by the server.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	b, _ := os.ReadFile(filepath.Join(dir, "20-watcher.yaml"))
	if err := os.WriteFile(bad, []byte(strings.Replace(string(b), "replicas: 2", "replicas: two", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl(ctx, "apply", "--dry-run=server", "-f", bad); err == nil {
		t.Fatalf("a manifest with replicas: two passed:\n%s", out)
	}
}
