package cniconformance_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

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
				// (a short retry budget: the default waits most of a minute)
				{Name: "controller-down", Config: []byte(strings.Replace(strings.Replace(good, cp.URL, "http://127.0.0.1:1", 1),
					`"hostId"`, `"timeouts":{"retry":"500ms"},"hostId"`, 1)), Code: types.ErrTryAgainLater},
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

// TestMizarmpControllerRestart kills the controller (SIGKILL) while 20
// ADDs run in parallel and starts it again on the same address: every ADD
// succeeds (the plugin retries within its budget and adopts the ports of
// creates whose answers were lost), every attachment passes CHECK and
// carries traffic, and the controller holds exactly the 20 ports, each with
// its own address.
func TestMizarmpControllerRestart(t *testing.T) {
	cp, _ := startControlPlane(t)
	bin := testutil.Bin(t, "mizarmp")
	p := cniconformance.Plugin{
		Type:      "mizarmp",
		Path:      []string{filepath.Dir(bin)},
		HostNetNS: true,
		Config: func(testing.TB, string) []byte {
			return cp.Conf("1.1.0", testutil.UniqueName("kcni"))
		},
	}
	e := cniconformance.NewEnv(t, &p, "1.1.0")
	const n = 20
	cs := make([]*cniconformance.Container, n)
	for i := range cs {
		cs[i] = e.NewContainer()
	}
	t.Cleanup(func() {
		for _, c := range cs {
			if err := e.Del(c); err != nil {
				t.Errorf("DEL %s: %v", c.ID, err)
			}
		}
		// No port leaked: the DELs removed every one.
		if ports, err := cp.Ports(context.Background()); err != nil || len(ports) != 0 {
			t.Errorf("ports left after the DELs (%v):\n%s", err, strings.Join(ports, "\n"))
		}
	})
	results := make([]types.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { results[i], errs[i] = e.Add(c) })
	}
	// Restart once the controller has taken the first ports, while the
	// rest are in flight.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ports, err := cp.Ports(t.Context())
		if err == nil && len(ports) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no port was created within 30s (last error %v)", err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := cp.RestartController(); err != nil {
		t.Fatalf("restart controller: %v", err)
	}
	wg.Wait()
	ips := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d during the restart: %v", i, err)
		}
		cniconformance.CheckResult(t, e.Version, results[i], cs[i])
		if err := e.Check(cs[i]); err != nil {
			t.Errorf("CHECK %d: %v", i, err)
		}
		r, err := types100.NewResultFromResult(results[i])
		if err != nil {
			t.Fatal(err)
		}
		ip := r.IPs[0].Address.IP.String()
		if j, dup := ips[ip]; dup {
			t.Errorf("containers %d and %d both have %s", j, i, ip)
		}
		ips[ip] = i
	}
	ports, err := cp.Ports(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != n {
		t.Errorf("the controller holds %d ports for %d attachments:\n%s", len(ports), n, strings.Join(ports, "\n"))
	}
	checkAgentMetrics(t, cp, n)
	// Traffic: container 0 reaches a TCP listener in each other one.
	for ip, i := range ips {
		if i == 0 {
			continue
		}
		if err := cniconformance.DialBetween(cs[i].NetNS, cs[0].NetNS, ip); err != nil {
			t.Errorf("container 0 to %d (%s): %v", i, ip, err)
		}
	}
}

// checkAgentMetrics: the agent serves /healthz (synced) and /metrics with
// at least plugs successful plugs, its sync histogram and queue depth.
func checkAgentMetrics(t *testing.T, cp *mpenv.Env, plugs int) {
	t.Helper()
	get := func(path string) (int, string) {
		resp, err := http.Get(cp.AgentMetrics + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("agent /healthz: %d %s", code, body)
	}
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("agent /metrics: %d", code)
	}
	for _, want := range []string{"kurma_agent_queue_depth ", `kurma_agent_sync_duration_seconds_count{kind="port",result="ok"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("agent /metrics lacks %s", want)
		}
	}
	var got float64
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, `kurma_agent_port_plug_duration_seconds_count{result="ok"} `); ok {
			got, _ = strconv.ParseFloat(v, 64)
		}
	}
	if got < float64(plugs) {
		t.Errorf("agent /metrics counts %v successful plugs, want at least %d", got, plugs)
	}
}
