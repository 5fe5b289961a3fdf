package cniconformance_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types/create"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/test/cniconformance"
)

func cnitoolBin(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "bin")
	}
	p := filepath.Join(dir, "tools", "cnitool")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("cnitool missing at %s; run `make tools`", p)
	}
	return p
}

// cnitoolCycle drives add/check/status/gc/del through cnitool for the
// network in conf and verifies that the container netns and the plugin's
// external state are as before at the end.
func cnitoolCycle(t *testing.T, tool *cniconformance.CNITool, conf []byte, external func() []string) {
	t.Helper()
	ctx := t.Context()
	var meta struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(conf, &meta); err != nil {
		t.Fatal(err)
	}
	if err := tool.WriteConf(meta.Name, conf); err != nil {
		t.Fatal(err)
	}
	ctr := testutil.NewNetNS(t)
	before := cniconformance.Snapshot(t, ctr.Path())
	var extBefore []string
	if external != nil {
		extBefore = external()
	}
	t.Cleanup(func() { _, _ = tool.Run(ctx, "del", meta.Name, ctr.Path()) })

	out, err := tool.Run(ctx, "add", meta.Name, ctr.Path())
	if err != nil {
		t.Fatal(err)
	}
	res, err := create.Create("1.1.0", out)
	if err != nil {
		t.Fatalf("add printed no 1.1.0 result: %v: %s", err, out)
	}
	cniconformance.CheckResult(t, "1.1.0", res, &cniconformance.Container{NetNS: ctr, IfName: "eth0"})
	for _, verb := range []string{"check", "status"} {
		if _, err := tool.Run(ctx, verb, meta.Name, ctr.Path()); err != nil {
			t.Fatal(err)
		}
	}
	// gc with no valid attachments removes the attachment (libcni DELs
	// it, then the plugin's GC runs); del afterwards is a no-op.
	if _, err := tool.Run(ctx, "gc", meta.Name, ctr.Path()); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.Run(ctx, "del", meta.Name, ctr.Path()); err != nil {
		t.Fatal(err)
	}
	if d := cniconformance.Diff(before, cniconformance.Snapshot(t, ctr.Path())); d != "" {
		t.Errorf("container netns changed:\n%s", d)
	}
	if external != nil {
		if d := cniconformance.Diff(extBefore, external()); d != "" {
			t.Errorf("external state changed:\n%s", d)
		}
	}
	// A second add/del cycle works after gc.
	if _, err := tool.Run(ctx, "add", meta.Name, ctr.Path()); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.Run(ctx, "del", meta.Name, ctr.Path()); err != nil {
		t.Fatal(err)
	}
}

func TestCNIToolBridge(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNetNS(t)
	tool := &cniconformance.CNITool{Bin: cnitoolBin(t), Path: []string{upstreamCNIDir(t)}, NetConfDir: t.TempDir(), HostNetNS: host.Path()}
	conf := bridgeConfig(t, "1.1.0")
	cnitoolCycle(t, tool, conf, func() []string { return hostLocalState(t, conf) })
}
