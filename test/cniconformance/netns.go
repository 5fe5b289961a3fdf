package cniconformance

import (
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/testutil"
)

// removeNetNS destroys a container netns early, as when the container
// dies before its DEL (its cleanup then finds it gone).
func removeNetNS(t testing.TB, n ns.NetNS) {
	t.Helper()
	_ = n.Close()
	if err := testutil.RemoveNetNS(n.Path()); err != nil {
		t.Fatalf("remove netns: %v", err)
	}
}

func newCNI(path []string, cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(path, cacheDir, nil)
}
