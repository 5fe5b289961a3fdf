package cniconformance_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/test/cniconformance"
	"kurma.dev/kurma/test/cniconformance/mpenv"
)

// startControlPlane runs the real controller and agent for this test.
func startControlPlane(t *testing.T) (*mpenv.Env, []string) {
	t.Helper()
	testutil.RequireRoot(t)
	prefix := "kc" + testutil.UniqueName("")[:3] // agent link prefix: at most 5 chars
	table := testutil.UniqueName("kcni")
	e, err := mpenv.Start(t.Context(), mpenv.Options{
		ControllerBin: testutil.Bin(t, "kurma-controller"),
		AgentBin:      testutil.Bin(t, "kurma-agent"),
		TmpDir:        t.TempDir(),
		Agent:         true,
		LinkPrefix:    prefix,
		NFTTable:      table,
	})
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs:\n%s", e.Logs())
		}
		e.Close()
	})
	return e, []string{" " + prefix, "table inet " + table}
}

func TestMizarmpConformance(t *testing.T) {
	cp, markers := startControlPlane(t)
	bin := testutil.Bin(t, "mizarmp")
	cniconformance.Run(t, cniconformance.Plugin{
		Type:        "mizarmp",
		Path:        []string{filepath.Dir(bin)},
		HostNetNS:   true,
		HostMarkers: markers,
		// The agent plugs and unplugs asynchronously: ADD waits for UP,
		// but DEL returns once the controller dropped the port.
		TransientHostState: true,
		Settle:             10 * time.Second,
		Config: func(t testing.TB, v string) []byte {
			return cp.Conf(v, testutil.UniqueName("kcni"))
		},
		ExternalState: func(t testing.TB, _ []byte) []string {
			ports, err := cp.Ports(context.Background())
			if err != nil {
				t.Fatalf("list ports: %v", err)
			}
			return ports
		},
		GCReleases:        true,
		ErrorsHaveVersion: true,
		InvalidConfigs: func(t testing.TB, v string) []cniconformance.InvalidConfig {
			good := string(cp.Conf(v, "kcnibad"))
			return []cniconformance.InvalidConfig{
				{Name: "missing-mpurl", Config: []byte(strings.Replace(good, `"mpurl":"`+cp.URL+`",`, "", 1)), Code: types.ErrInvalidNetworkConfig},
				{Name: "bad-subnet-id", Config: []byte(strings.Replace(good, cp.Subnet, "../x", 1)), Code: types.ErrInvalidNetworkConfig},
				{Name: "unknown-subnet", Config: []byte(strings.Replace(good, cp.Subnet, "kcni-no-such-subnet", 1)), Code: types.ErrInvalidNetworkConfig},
				{Name: "unknown-project", Config: []byte(strings.Replace(good, cp.Project, "kcni-no-such-project", 1)), Code: types.ErrInvalidNetworkConfig},
				{Name: "controller-down", Config: []byte(strings.Replace(good, cp.URL, "http://127.0.0.1:1", 1)), Code: types.ErrTryAgainLater},
				{Name: "timeouts-not-duration", Config: []byte(strings.Replace(good, `"hostId"`, `"timeouts":{"up":7},"hostId"`, 1)), Code: types.ErrDecodingFailure},
			}
		},
	})
}

func TestCNIToolMizarmp(t *testing.T) {
	cp, _ := startControlPlane(t)
	tool := &cniconformance.CNITool{Bin: cnitoolBin(t), Path: []string{filepath.Dir(testutil.Bin(t, "mizarmp"))}, NetConfDir: t.TempDir()}
	conf := cp.Conf("1.1.0", testutil.UniqueName("kcni"))
	cnitoolCycle(t, tool, conf, func() []string {
		ports, err := cp.Ports(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ports
	})
	_ = fmt.Sprint()
}
