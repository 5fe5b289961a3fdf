package cli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestCLIDoesNotLinkTheStore: the kurma binary names the image store's
// types through internal/image/imagetypes and the pod types through
// internal/pod/podtypes, and talks to kurmad through internal/api/client.
// It must not link the store (its registry client), the pod runtime, the
// API server or net/http (crypto/tls and x509 with it), whose package
// initialisation and page faults every command would pay at start-up.
func TestCLIDoesNotLinkTheStore(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	cmd := exec.Command(goBin, "list", "-deps", "./cmd/kurma")
	cmd.Dir = testutil.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		exact := []string{"kurma.dev/kurma/internal/image", "kurma.dev/kurma/internal/pod", "kurma.dev/kurma/internal/api",
			"net/http", "crypto/tls", "crypto/x509", "github.com/google/uuid"}
		for _, bad := range append(exact, "github.com/google/go-containerregistry", "github.com/vishvananda/netlink/nl") {
			if p == bad || (!slices.Contains(exact, bad) && strings.HasPrefix(p, bad)) {
				t.Errorf("cmd/kurma links %s", p)
			}
		}
	}
}
