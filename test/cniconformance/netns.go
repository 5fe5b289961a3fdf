package cniconformance

import (
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// removeNetNS destroys a container netns early, as when the container
// dies before its DEL (its cleanup then finds it gone).
func removeNetNS(t testing.TB, n ns.NetNS) {
	t.Helper()
	_ = n.Close()
	// Unmount can fail with EBUSY while a parallel test changes mounts
	// under /run/netns: retry briefly.
	var err error
	for range 20 {
		if err = testutils.UnmountNS(n); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("remove netns: %v", err)
}

func newCNI(path []string, cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(path, cacheDir, nil)
}
