package datapath

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// maxPlugRequests bounds the netlink requests of a fresh plug (its VPC
// ensured) of a port with one address: the pair's creation (whose echo
// gives the container end's index: no lookup), the host end's alias and
// the removal of the host's neighbour entry for the address (its previous
// owner's MAC: see forgetNeighbours) in the host namespace; the container
// end's alias, address, up and default route in the pod's. Every request
// but a lookup takes the kernel's RTNL lock, which a burst of pod
// sandboxes contends for. (8 before the echo, 7 before the neighbour
// removal.)
const maxPlugRequests = 7

// plugOnceEnv makes TestPlugNetlinkRequests, run as a child, plug one
// port between two markers instead of tracing.
const plugOnceEnv = "KURMA_TEST_PLUG_ONCE"

// TestPlugNetlinkRequests counts the netlink requests one fresh plug
// sends: the test runs itself under strace, where the child plugs one
// port between two marker writes.
func TestPlugNetlinkRequests(t *testing.T) {
	testutil.RequireRoot(t)
	if os.Getenv(plugOnceEnv) != "" {
		plugOnce(t)
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace not installed")
	}
	trace := filepath.Join(t.TempDir(), "trace")
	cmd := exec.CommandContext(t.Context(), strace, "-f", "-qq", "-e", "trace=sendto,sendmsg,setns,write", "-o", trace,
		os.Args[0], "-test.run=^TestPlugNetlinkRequests$", "-test.count=1")
	cmd.Env = append(os.Environ(), plugOnceEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Requests between each pair of markers: "fresh" (the first plug)
	// and "replug" (the same port plugged again, which every agent resync
	// did to every local port until it learned to touch nothing of an
	// unchanged one).
	sends, setns := map[string]int{}, map[string]int{}
	in := ""
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		l := s.Text()
		switch {
		case strings.Contains(l, `"kurma-plug-begin"`):
			in = "fresh"
		case strings.Contains(l, `"kurma-replug-begin"`):
			in = "replug"
		case strings.Contains(l, `"kurma-plug-end"`), strings.Contains(l, `"kurma-replug-end"`):
			in = ""
		case in == "":
		case strings.Contains(l, "sendto(") || strings.Contains(l, "sendmsg("):
			sends[in]++
		case strings.Contains(l, "setns("):
			setns[in]++
		}
	}
	t.Logf("one fresh plug: %d netlink requests, %d setns calls", sends["fresh"], setns["fresh"])
	t.Logf("the same port plugged again (a resync's replug): %d netlink requests, %d setns calls", sends["replug"], setns["replug"])
	if sends["fresh"] == 0 || sends["replug"] == 0 {
		t.Fatal("no request seen between the markers")
	}
	if sends["fresh"] > maxPlugRequests {
		t.Errorf("a fresh plug sent %d netlink requests, want at most %d", sends["fresh"], maxPlugRequests)
	}
}

// plugOnce ensures a VPC and plugs one port, then plugs it again, each
// plug between marker writes to /dev/null.
func plugOnce(t *testing.T) {
	h := newTestHost(t, "192.0.2.1/24", dummyUnderlay(t))
	if err := h.dp.EnsureVPC(t.Context(), VPCSpec{VNI: 7, Gateways: []net.IPNet{ipnet(t, "10.7.0.1/24")}}); err != nil {
		t.Fatal(err)
	}
	pod := nettest.NewNS(t, testutil.UniqueName(testPrefix))
	p := portSpec(t, "counted", 7, pod, "10.7.0.5/24", "10.7.0.1", 5)
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	_, _ = null.WriteString("kurma-plug-begin")
	err = h.dp.Plug(t.Context(), p)
	_, _ = null.WriteString("kurma-plug-end")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = null.WriteString("kurma-replug-begin")
	err = h.dp.Plug(t.Context(), p)
	_, _ = null.WriteString("kurma-replug-end")
	if err != nil {
		t.Fatal(err)
	}
}
