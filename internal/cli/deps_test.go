package cli

import (
	"os/exec"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestCLIDoesNotLinkTheStore: the kurma binary names the image store's
// types through internal/image/imagetypes and must not link the store,
// whose registry client and its dependencies cost every command their
// package initialisation at start-up.
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
		for _, bad := range []string{"kurma.dev/kurma/internal/image", "github.com/google/go-containerregistry", "github.com/vishvananda/netlink/nl"} {
			if p == bad || (bad != "kurma.dev/kurma/internal/image" && strings.HasPrefix(p, bad)) {
				t.Errorf("cmd/kurma links %s", p)
			}
		}
	}
}
