package cnid_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

type call struct {
	cmd, cid, netns, args string
	stdin                 string
}

// shim execs the kurma-k8s binary as a runtime would.
func shim(t *testing.T, e *kubetest.Env, c call) (out []byte, code int) {
	t.Helper()
	cmd := exec.Command(e.Bin("kurma-k8s"))
	cmd.Env = []string{"CNI_COMMAND=" + c.cmd, "CNI_CONTAINERID=" + c.cid, "CNI_NETNS=" + c.netns,
		"CNI_IFNAME=eth0", "CNI_ARGS=" + c.args, "CNI_PATH=/nonexistent"}
	cmd.Stdin = strings.NewReader(c.stdin)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return out, ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out, 0
}

func cniArgs(ns, name, uid string) string {
	// containerd's keys, in an order of its own.
	return "K8S_POD_UID=" + uid + ";IgnoreUnknown=1;K8S_POD_NAME=" + name + ";K8S_POD_NAMESPACE=" + ns + ";K8S_POD_INFRA_CONTAINER_ID=x"
}

func errCode(t *testing.T, out []byte) uint {
	t.Helper()
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(out, &e); err != nil {
		t.Fatalf("error JSON %q: %v", out, err)
	}
	return e.Code
}

// TestDriver drives the shim and the agent's daemon against a real API
// server, controller, watcher and agent datapath: ADD plugs the port of
// the pod's annotation, two pods reach each other, CHECK/DEL/GC/STATUS
// behave, the documented error codes come back, an agent killed with
// SIGKILL keeps the pods plugged and honours their DEL after restart, and
// a DEL sent while the agent is down is queued and carried out when it is
// back.
func TestDriver(t *testing.T) {
	e := kubetest.Start(t, kubecluster.Options{NoNode: true})
	ctx := context.Background()
	for _, n := range []string{"n1", "n2"} {
		if _, err := e.C.Client.CoreV1().Nodes().Create(ctx, nodeObj(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.StartWatcher()
	const metricsAddr = "127.0.0.1:19796"
	a := e.StartAgent("n1", kubecluster.NodeIP, "--k8s-annotation-timeout", "2s", "--metrics-listen", metricsAddr)
	e.Namespace("drv")
	pconf := `{"cniVersion":"1.1.0","name":"kurma","type":"kurma-k8s","socket":"` + a.Socket + `"}`

	type pod struct {
		name, uid, netns, cid string
		res                   *types100.Result
	}
	var pods []*pod
	for _, name := range []string{"p1", "p2"} {
		p, err := e.C.Client.CoreV1().Pods("drv").Create(ctx, kubetest.Pod("drv", name, "n1"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nsh := testutil.NewNetNS(t)
		pods = append(pods, &pod{name: name, uid: string(p.UID), netns: nsh.Path(), cid: testutil.UniqueName("cid")})
	}
	// STATUS is ready once the agent synced.
	e.Eventually(20*time.Second, "STATUS ready", func() error {
		if out, code := shim(t, e, call{cmd: "STATUS", stdin: pconf}); code != 0 {
			return fmt.Errorf("STATUS: %s", out)
		}
		return nil
	})
	for _, p := range pods {
		start := time.Now()
		out, code := shim(t, e, call{"ADD", p.cid, p.netns, cniArgs("drv", p.name, p.uid), pconf})
		if code != 0 {
			t.Fatalf("ADD %s: %s", p.name, out)
		}
		t.Logf("ADD %s took %s", p.name, time.Since(start))
		var res types100.Result
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatal(err)
		}
		pp, n := e.WaitAnnotated("drv", p.name, time.Second)
		if len(res.IPs) != 1 || res.IPs[0].Address.String() != n.IPs[0] || res.Interfaces[0].Mac != n.MAC ||
			res.Interfaces[0].Sandbox != p.netns || string(pp.UID) != p.uid {
			t.Fatalf("ADD result %s does not match annotation %+v", out, n)
		}
		p.res = &res
		if got := nettest.IP(t, p.netns, "-br", "addr", "show", "eth0"); !strings.Contains(got, n.IPs[0]) || !strings.Contains(got, "UP") {
			t.Fatalf("eth0 in %s: %s", p.name, got)
		}
		// The agent reports UP after the ADD has returned.
		e.Eventually(10*time.Second, "port UP after ADD", func() error {
			port, err := e.Ctl.GetPort(ctx, n.ProjectID, n.PortID)
			if err != nil || port.Status != "UP" {
				return fmt.Errorf("port after ADD: %+v, %v", port, err)
			}
			return nil
		})
		if out, code := shim(t, e, call{"CHECK", p.cid, p.netns, cniArgs("drv", p.name, p.uid), withPrev(pconf, out)}); code != 0 {
			t.Fatalf("CHECK %s: %s", p.name, out)
		}
	}
	// The ADDs' phases are on the agent's /metrics.
	body := scrape(t, e, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`kurma_cni_request_seconds_count{command="ADD",result="ok"} 2`,
		`kurma_cni_add_phase_seconds_count{phase="annotation"} 2`,
		`kurma_cni_add_phase_seconds_count{phase="attach"} 2`,
		`kurma_agent_attach_seconds_count{phase="plugged"} 2`,
		`kurma_agent_attach_seconds_count{phase="port_wait"} 2`,
		`kurma_agent_queue_wait_seconds_count{kind="port",urgent="true"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("agent metrics lack %q", want)
		}
	}
	ip2 := pods[1].res.IPs[0].Address.IP.String()
	nettest.Serve(t, pods[1].netns, ip2+":7777", "hello from p2")
	if err := nettest.Reach(ctx, pods[0].netns, ip2+":7777", "hello from p2"); err != nil {
		t.Fatalf("p1 -> p2: %v", err)
	}

	// Error codes.
	nsh := testutil.NewNetNS(t)
	for _, c := range []struct {
		name string
		args string
		want uint
	}{
		{"pod not found", cniArgs("drv", "nope", "u"), cniwire.ErrPodNotFound},
		{"uid mismatch", cniArgs("drv", "p1", "00000000-0000-0000-0000-000000000000"), cniwire.ErrUIDMismatch},
		{"no K8S_POD_NAME", "IgnoreUnknown=1;K8S_POD_NAMESPACE=drv", 4},
	} {
		out, code := shim(t, e, call{"ADD", testutil.UniqueName("cid"), nsh.Path(), c.args, pconf})
		if code == 0 || errCode(t, out) != c.want {
			t.Fatalf("%s: exit %d, %s; want code %d", c.name, code, out, c.want)
		}
	}
	// A pod bound to another node: the annotation names another host.
	other, err := e.C.Client.CoreV1().Pods("drv").Create(ctx, kubetest.Pod("drv", "elsewhere", "n2"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, code := shim(t, e, call{"ADD", testutil.UniqueName("cid"), nsh.Path(), cniArgs("drv", "elsewhere", string(other.UID)), pconf})
	if code == 0 || errCode(t, out) != cniwire.ErrAnnotationTimeout || time.Since(start) > 5*time.Second {
		t.Fatalf("pod of another node: exit %d after %s, %s; want code %d after ~2s", code, time.Since(start), out, cniwire.ErrAnnotationTimeout)
	}
	if got := nettest.Links(t, nsh.Path()); len(got) != 1 {
		t.Fatalf("failed ADDs left links behind: %v", got)
	}
	// No agent: 11.
	if out, code := shim(t, e, call{"ADD", "c", nsh.Path(), cniArgs("drv", "p1", pods[0].uid),
		strings.Replace(pconf, a.Socket, a.Socket+".none", 1)}); code == 0 || errCode(t, out) != 11 {
		t.Fatalf("no agent: %s", out)
	}

	// kill -9 the agent: pods stay plugged; the restarted agent honours DEL.
	if err := syscall.Kill(a.Proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.RestartAgent(a)
	e.Eventually(20*time.Second, "STATUS ready after restart", func() error {
		if out, code := shim(t, e, call{cmd: "STATUS", stdin: pconf}); code != 0 {
			return fmt.Errorf("STATUS: %s", out)
		}
		return nil
	})
	// The restarted agent's first listing ends with a full resync, which
	// syncs both local ports: once it has (and its queue is empty), a
	// sync that would unplug a pod has had its chance.
	e.Eventually(20*time.Second, "the restarted agent's resync", func() error {
		body, err := get(e, "http://"+metricsAddr+"/metrics")
		if err != nil {
			return err
		}
		if n := metricValue(body, `kurma_agent_sync_duration_seconds_count{kind="port",result="ok"}`); n < 2 {
			return fmt.Errorf("%v port syncs since the restart, want 2", n)
		}
		if n := metricValue(body, "kurma_agent_queue_depth"); n != 0 {
			return fmt.Errorf("queue depth %v", n)
		}
		return nil
	})
	if err := nettest.Reach(ctx, pods[0].netns, ip2+":7777", "hello from p2"); err != nil {
		t.Fatalf("p1 -> p2 after agent restart: %v", err)
	}
	// A DEL while the agent is down is queued, succeeds, and is carried
	// out when the agent is back; the other pod stays plugged.
	if err := syscall.Kill(a.Proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.Proc.Done()
	if out, code := shim(t, e, call{"DEL", pods[0].cid, pods[0].netns, cniArgs("drv", "p1", pods[0].uid), pconf}); code != 0 {
		t.Fatalf("DEL with the agent down: exit %d, %s; want it queued", code, out)
	}
	queue := cniwire.DelQueue(a.Socket)
	if ents, err := os.ReadDir(queue); err != nil || len(ents) != 1 {
		t.Fatalf("DEL queue %s: %v, %v; want one file", queue, ents, err)
	}
	e.RestartAgent(a)
	e.Eventually(20*time.Second, "queued DEL carried out", func() error {
		ents, err := os.ReadDir(queue)
		if err != nil || len(ents) != 0 {
			return fmt.Errorf("queue: %v, %v", ents, err)
		}
		if got := nettest.Links(t, pods[0].netns); len(got) != 1 {
			return fmt.Errorf("p1 still has links %v", got)
		}
		return nil
	})
	if got := nettest.Links(t, pods[1].netns); len(got) != 2 {
		t.Fatalf("p2 lost its interface to p1's queued DEL: %v", got)
	}
	for i := 0; i < 2; i++ { // DEL twice more: nothing left to do, and success
		if out, code := shim(t, e, call{"DEL", pods[0].cid, pods[0].netns, cniArgs("drv", "p1", pods[0].uid), pconf}); code != 0 {
			t.Fatalf("DEL #%d: %s", i+1, out)
		}
	}
	if got := nettest.Links(t, pods[0].netns); len(got) != 1 {
		t.Fatalf("after DEL p1 has links %v", got)
	}
	// GC with p2 not valid releases it.
	gc := `{"cniVersion":"1.1.0","name":"kurma","type":"kurma-k8s","socket":"` + a.Socket + `","cni.dev/valid-attachments":[]}`
	if out, code := shim(t, e, call{cmd: "GC", stdin: gc}); code != 0 {
		t.Fatalf("GC: %s", out)
	}
	if got := nettest.Links(t, pods[1].netns); len(got) != 1 {
		t.Fatalf("after GC p2 has links %v", got)
	}
	ents, _ := os.ReadDir(a.StateDir + "/k8s")
	if len(ents) != 0 {
		t.Fatalf("attachment records left: %v", ents)
	}
}

// scrape GETs url from inside the cluster's network namespace, where the
// agent runs.
func scrape(t *testing.T, e *kubetest.Env, url string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: e.C.DialContext}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}

// get is scrape that returns its error.
func get(e *kubetest.Env, url string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: e.C.DialContext}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b), nil
}

// metricValue is the value of the sample named series (name and labels
// as exposed) in a Prometheus text body; -1 when absent.
func metricValue(body, series string) float64 {
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return f
			}
		}
	}
	return -1
}

func withPrev(conf string, res []byte) string {
	return strings.TrimSuffix(conf, "}") + `,"prevResult":` + string(bytes.TrimSpace(res)) + "}"
}

func nodeObj(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
