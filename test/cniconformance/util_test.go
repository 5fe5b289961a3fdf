package cniconformance_test

import (
	"encoding/json"
	"os"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// TestMain puts back the forwarding sysctls and the empty nft tables that
// podman, containerd and the upstream plugins leave in the host netns.
func TestMain(m *testing.M) { os.Exit(testutil.KeepHost(m)) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
