package cniconformance_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/test/cniconformance"
)

// upstreamCNIDir is bin/cni, where `make tools` puts the pinned upstream
// plugins.
func upstreamCNIDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "bin")
	}
	dir = filepath.Join(dir, "cni")
	if _, err := os.Stat(filepath.Join(dir, "bridge")); err != nil {
		t.Skipf("upstream CNI plugins missing in %s; run `make tools`", dir)
	}
	return dir
}

// bridgeConfig is a fresh bridge+host-local network (ipMasq on) with its
// own bridge name, subnet and IPAM data dir.
func bridgeConfig(t testing.TB, v string) []byte {
	name := testutil.UniqueName("kcni")
	sub := fmt.Sprintf("10.%d.%d.0/24", 200+rand.IntN(50), rand.IntN(250))
	return fmt.Appendf(nil, `{"cniVersion":%q,"name":%q,"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,
"ipam":{"type":"host-local","subnet":%q,"dataDir":%q,"routes":[{"dst":"0.0.0.0/0"}]}}`,
		v, name, name, sub, t.TempDir())
}

// hostLocalState lists host-local's reservations (one file per address).
func hostLocalState(t testing.TB, conf []byte) []string {
	list, err := cniconformance.ParseConfList(conf)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		IPAM struct {
			DataDir string `json:"dataDir"`
		} `json:"ipam"`
	}
	if err := jsonUnmarshal(list.Plugins[0].Bytes, &c); err != nil {
		t.Fatal(err)
	}
	var out []string
	_ = filepath.WalkDir(c.IPAM.DataDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			base := filepath.Base(p)
			if base != "lock" && !slices.Contains([]string{"last_reserved_ip.0"}, base) {
				out = append(out, p)
			}
		}
		return nil
	})
	return out
}

func TestBridgeConformance(t *testing.T) {
	testutil.RequireRoot(t)
	dir := upstreamCNIDir(t)
	cniconformance.Run(t, cniconformance.Plugin{
		Type:          "bridge",
		Parallel:      true,
		Path:          []string{dir},
		Config:        bridgeConfig,
		ExternalState: hostLocalState,
		// Upstream bridge skips its masquerade teardown (iptables or nft
		// backend) when DEL comes with an empty netns, and has no GC to
		// catch up later: those rules leak.
		Tolerate: func(check, line string) bool {
			return check == "del-gone-netns" && (strings.HasPrefix(line, "iptables-save: ") ||
				strings.HasPrefix(line, "ip6tables-save: ") || strings.HasPrefix(line, "nft list ruleset: "))
		},
		InvalidConfigs: func(t testing.TB, v string) []cniconformance.InvalidConfig {
			return []cniconformance.InvalidConfig{
				// Not an IPAM error: upstream bridge leaks its bridge and veth
				// when IPAM fails after the links exist.
				{Name: "bridge-not-string", Config: fmt.Appendf(nil, `{"cniVersion":%q,"name":"kcnibad","type":"bridge","bridge":7,"ipam":{"type":"host-local","subnet":"10.0.0.0/24","dataDir":%q}}`, v, t.TempDir())},
				{Name: "missing-name", Config: fmt.Appendf(nil, `{"cniVersion":%q,"type":"bridge"}`, v), Code: types.ErrInvalidNetworkConfig},
			}
		},
	})
}
