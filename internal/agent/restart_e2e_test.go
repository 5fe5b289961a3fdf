package agent_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/pkg/controllerapi"
)

// timers matches the running timers `ip -d link` shows.
var timers = regexp.MustCompile(`\b\w+_timer +[0-9.]+`)

// kernelState is what a host's datapath holds in the kernel: the nft
// ruleset, links, addresses, routes, permanent
// neighbours and static FDB entries. Counters and learned entries are
// left out: traffic changes them.
func kernelState(t *testing.T, h *host) map[string][]string {
	t.Helper()
	run := func(args ...string) []string {
		// Standard output only: ip writes to standard error a line per
		// veth whose peer lies in a namespace it cannot name ("Peer netns
		// reference is invalid"), which depends on what else runs on the
		// machine, not on this host.
		out, err := exec.Command("ip", append([]string{"netns", "exec", nettest.Name(h.ns)}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				out = append(out, ee.Stderr...)
			}
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimRight(l, " "); l != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	keep := func(lines []string, f func(string) bool) []string {
		return slices.DeleteFunc(lines, func(l string) bool { return !f(l) })
	}
	ruleset := run("nft", "list", "ruleset")
	links := run("ip", "-d", "-o", "link", "show")
	for i, l := range links {
		links[i] = timers.ReplaceAllString(l, "")
	}
	sorted := func(l []string) []string { slices.Sort(l); return l }
	return map[string][]string{
		"nft":    ruleset,
		"links":  links,
		"addrs":  run("ip", "-4", "-o", "addr", "show"),
		"routes": run("ip", "-4", "route", "show", "table", "all"),
		"neigh":  sorted(run("ip", "neigh", "show", "nud", "permanent")),
		"fdb": sorted(keep(run("bridge", "fdb", "show"), func(l string) bool {
			return strings.Contains(l, "permanent") || strings.Contains(l, "static")
		})),
	}
}

// monitor runs `what` in h's namespace until the test ends and returns
// what it printed so far.
func monitor(t *testing.T, c *cluster, h *host, name string, args ...string) func() []string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", nettest.Name(h.ns)}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var (
		mu    sync.Mutex
		lines []string
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, time.Now().Format("15:04:05.000")+" "+sc.Text())
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// agentReady polls the agent's readiness in h's namespace.
func agentReady(h *host) bool {
	res, err := nsHTTPClient(h.ns).Get("http://127.0.0.1:9697/healthz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// agentMetric reads one unlabelled metric of the agent in h's namespace.
func agentMetric(h *host, name string) (float64, error) {
	res, err := nsHTTPClient(h.ns).Get("http://127.0.0.1:9697/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in the agent's metrics", name)
}

// waitResyncs waits until the agent on h has run n more periodic
// resyncs than now and has nothing queued: whatever those resyncs found
// to do is done.
func waitResyncs(t *testing.T, h *host, n float64) {
	t.Helper()
	var start float64
	until(t, 10*time.Second, "the agent's resync count on "+h.id, func() error {
		var err error
		start, err = agentMetric(h, "kurma_agent_resyncs_total")
		return err
	})
	until(t, 30*time.Second, fmt.Sprintf("%v resyncs of the agent on %s with an empty queue", n, h.id), func() error {
		got, err := agentMetric(h, "kurma_agent_resyncs_total")
		if err != nil {
			return err
		}
		depth, err := agentMetric(h, "kurma_agent_queue_depth")
		if err != nil {
			return err
		}
		if got < start+n || depth != 0 {
			return fmt.Errorf("%v resyncs since %v, %v keys queued", got-start, start, depth)
		}
		return nil
	})
}

// TestAgentRestartKeepsDatapath: an agent stopped and started again (as a
// rolling upgrade does) leaves its host's kernel state as it was: the
// same nft ruleset and set elements, links, addresses, routes,
// neighbours and FDB entries, and nothing of it is removed meanwhile
// (nothing flushed and refilled). Connections opened all along, to the
// VIP from another pod and from a member (hairpin) and to the pod on the
// other host, never fail.
func TestAgentRestartKeepsDatapath(t *testing.T) {
	ctx := t.Context()
	c := newCluster(t, 2)
	pid, sn, svc := c.lbNetwork(ctx, "restart", "10.50.0.0/24")
	pods := []pod{c.newPod(ctx, t, pid, sn.ID, c.hosts[0]), c.newPod(ctx, t, pid, sn.ID, c.hosts[0]),
		c.newPod(ctx, t, pid, sn.ID, c.hosts[1])}
	c.waitUp(ctx, t, pid, pods...)
	client, m1, m2 := pods[0], pods[1], pods[2]
	serveWho(t, m1.ns, m1.ip()+":8080", "m1")
	serveWho(t, m2.ns, m2.ip()+":8080", "m2")
	members := []controllerapi.Member{{Address: m1.ip()}, {Address: m2.ip()}}
	lb, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{Name: "svc", VIPSubnetID: svc.ID, Policy: controllerapi.Policy{HostAccess: true},
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}}, Members: members})
	if err != nil {
		t.Fatal(err)
	}
	// A VIP in the pods' own subnet: the host answers ARP for it (a
	// local route).
	onLink, err := c.c.CreateLoadBalancer(ctx, pid, controllerapi.LoadBalancer{Name: "onlink", VIPSubnetID: sn.ID,
		Listeners: []controllerapi.Listener{{Protocol: "TCP", Port: 80, TargetPort: 8080}}, Members: members})
	if err != nil {
		t.Fatal(err)
	}
	type probe struct{ from, addr string }
	probes := []probe{
		{client.ns, lb.VIPAddress + ":80"},     // both members, one over VXLAN
		{m1.ns, lb.VIPAddress + ":80"},         // hairpin half the time
		{client.ns, onLink.VIPAddress + ":80"}, // on-link VIP
		{client.ns, m2.ip() + ":8080"},         // the pod on the other host
	}
	for _, p := range probes {
		until(t, 10*time.Second, "reach "+p.addr, func() error {
			seen, err := spread(p.from, "tcp", p.addr, 10)
			if err != nil {
				return fmt.Errorf("seen %v: %w", seen, err)
			}
			return nil
		})
	}
	// Settled: two more resyncs on each host, and nothing queued.
	for _, h := range c.hosts {
		waitResyncs(t, h, 2)
	}
	before := map[string]map[string][]string{}
	var mons []func() []string
	for _, h := range c.hosts {
		before[h.id] = kernelState(t, h)
		mons = append(mons, monitor(t, c, h, "nft monitor", "nft", "monitor"),
			monitor(t, c, h, "ip monitor", "ip", "monitor", "link", "address", "route", "neigh"))
	}
	// Connections all along.
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
		answered int
	)
	for _, p := range probes {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := who(p.from, "tcp", p.addr)
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), p.addr, err))
				} else {
					answered++
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	for _, h := range c.hosts {
		h.proc.stop()
		restarted := time.Now()
		c.startAgent(h)
		until(t, 20*time.Second, "agent on "+h.id+" ready again", func() error {
			if !agentReady(h) {
				return fmt.Errorf("not ready")
			}
			return nil
		})
		t.Logf("agent on %s ready %v after its restart", h.id, time.Since(restarted).Round(time.Millisecond))
		// Several resyncs of the new agent.
		waitResyncs(t, h, 3)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d connections answered, %d failed", answered, len(failures))
	if len(failures) > 0 {
		t.Errorf("connections failed while the agents restarted:\n%s", strings.Join(failures, "\n"))
	}
	for _, h := range c.hosts {
		after := kernelState(t, h)
		for k, b := range before[h.id] {
			if !slices.Equal(b, after[k]) {
				t.Errorf("%s: %s differ after the restart:\nbefore:\n%s\nafter:\n%s", h.id, k, strings.Join(b, "\n"), strings.Join(after[k], "\n"))
			}
		}
	}
	// Nothing was removed meanwhile: no element, rule, set, link,
	// address, route or neighbour deleted (and added back).
	for _, m := range mons {
		for _, l := range m() {
			if strings.Contains(l, " delete ") || strings.Contains(l, "Deleted ") {
				t.Errorf("removed during the restart: %s", l)
			}
		}
	}
}
