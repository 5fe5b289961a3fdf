package manager_test

import (
	"os"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestMain puts back the forwarding sysctls and the empty nft tables the
// upstream bridge plugin leaves in the host netns.
func TestMain(m *testing.M) { os.Exit(testutil.KeepHost(m)) }
