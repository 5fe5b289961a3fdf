// Command agent benchmarks the host agent through the real controller:
// create→UP latency (POST a port, long-poll until the agent reports it UP;
// p50/p99 over sequential creates) and plug rate (one bulk POST of N
// ports until all are UP). The peer is the upstream CNI bridge plugin
// (with host-local IPAM) doing ADD into the same kind of namespaces, timed
// the same way in the same run.
//
// Everything runs inside namespaces this program creates (prefix
// "kagtb"), with the controller and agent in a private "host" namespace
// listening on its loopback; all are removed at exit. Needs root.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/pkg/controllerapi"

	"kurma.dev/kurma/bench/internal/benchutil"
)

func main() {
	n := flag.Int("n", 200, "ports per measurement")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Println("bench/agent: needs root; skipped")
		return
	}
	b := &bench{}
	err := b.run(*n)
	b.cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/agent:", err)
		os.Exit(1)
	}
}

type bench struct {
	dir   string
	nss   []string // namespace names to delete
	procs []*exec.Cmd
	hostN string
}

func (b *bench) cleanup() {
	for _, p := range b.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	for _, n := range b.nss {
		_ = exec.Command("ip", "netns", "del", n).Run()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

func uniq(prefix string) string {
	r := make([]byte, 4)
	_, _ = rand.Read(r)
	return prefix + hex.EncodeToString(r)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}

func (b *bench) newNS() (string, error) {
	n := uniq("kagtb")
	if err := run("ip", "netns", "add", n); err != nil {
		return "", err
	}
	b.nss = append(b.nss, n)
	return "/run/netns/" + n, nil
}

// binary finds a built program in $KURMA_BIN_DIR (or ./bin), else builds it.
func (b *bench) binary(name string) (string, error) {
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = "bin"
	}
	if p, err := filepath.Abs(filepath.Join(dir, name)); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	out := filepath.Join(b.dir, name)
	if err := run("go", "build", "-o", out, "./cmd/"+name); err != nil {
		return "", err
	}
	return out, nil
}

func (b *bench) run(n int) error {
	var err error
	if b.dir, err = os.MkdirTemp("", "kagtbench"); err != nil {
		return err
	}
	ctlBin, err := b.binary("kurma-controller")
	if err != nil {
		return err
	}
	agentBin, err := b.binary("kurma-agent")
	if err != nil {
		return err
	}
	hostNS, err := b.newNS()
	if err != nil {
		return err
	}
	b.hostN = filepath.Base(hostNS)
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "kagtu0", "type", "veth", "peer", "name", "kagtu1"},
		{"addr", "add", "192.0.2.1/24", "dev", "kagtu0"},
		{"link", "set", "kagtu0", "up"},
		{"link", "set", "kagtu1", "up"},
	} {
		if err := run("ip", append([]string{"-n", b.hostN}, args...)...); err != nil {
			return err
		}
	}
	if err := b.start(filepath.Join(b.dir, "controller.log"), ctlBin, "--listen", "127.0.0.1:9696",
		"--store", "bolt:"+filepath.Join(b.dir, "ctl.db"), "--log-level", "warn"); err != nil {
		return err
	}
	c, err := controllerapi.New("http://127.0.0.1:9696", controllerapi.WithHTTPClient(nsHTTPClient(hostNS)))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := waitReady(ctx, c); err != nil {
		return err
	}
	if err := b.start(filepath.Join(b.dir, "agent.log"), agentBin, "--controller", "http://127.0.0.1:9696",
		"--host-id", "bench", "--underlay-ip", "192.0.2.1", "--underlay-dev", "kagtu0",
		"--state-dir", filepath.Join(b.dir, "agent"), "--link-prefix", "kagt", "--nft-table", uniq("kagt"), "--workers", "4"); err != nil {
		return err
	}
	proj, err := c.CreateProject(ctx, controllerapi.Project{Name: "bench"})
	if err != nil {
		return err
	}
	vpc, err := c.CreateVPC(ctx, proj.ID, controllerapi.VPC{Name: "bench"})
	if err != nil {
		return err
	}
	sn, err := c.CreateSubnet(ctx, proj.ID, controllerapi.Subnet{NetworkID: vpc.ID, CIDR: "10.64.0.0/16", IPVersion: 4})
	if err != nil {
		return err
	}
	pods := make([]string, 2*n)
	for i := range pods {
		if pods[i], err = b.newNS(); err != nil {
			return err
		}
	}
	port := func(nsPath string) controllerapi.Port {
		return controllerapi.Port{NetworkID: sn.ID, VethName: "eth0", NetworkNS: nsPath, BindingHostID: "bench"}
	}
	// Warm-up: the VPC's bridge and vxlan are created by the first port.
	warm, err := b.newNS()
	if err != nil {
		return err
	}
	if _, _, err := createUp(ctx, c, proj.ID, port(warm)); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	lat := make([]time.Duration, 0, n)
	posts := make([]time.Duration, 0, n)
	for i := range n {
		d, post, err := createUp(ctx, c, proj.ID, port(pods[i]))
		if err != nil {
			return err
		}
		lat = append(lat, d)
		posts = append(posts, post)
	}
	ps := make([]controllerapi.Port, n)
	for i := range ps {
		ps[i] = port(pods[n+i])
	}
	start := time.Now()
	created, err := c.CreatePorts(ctx, proj.ID, ps)
	if err != nil {
		return err
	}
	if err := waitAllUp(ctx, c, proj.ID, created); err != nil {
		return err
	}
	rate := float64(n) / time.Since(start).Seconds()

	peerLat, peerRate, err := b.peer(ctx, n)
	if err != nil {
		return err
	}
	p50, p99 := benchutil.Samples(lat).Pct(0.50), benchutil.Samples(lat).Pct(0.99)
	q50, q99 := benchutil.Samples(peerLat).Pct(0.50), benchutil.Samples(peerLat).Pct(0.99)
	var load [3]float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		_, _ = fmt.Sscan(string(b), &load[0], &load[1], &load[2])
	}
	fmt.Printf("host load average %.1f on %d CPUs (figures are noisy when it exceeds the CPUs)\n", load[0], runtime.NumCPU())
	fmt.Printf("agent (controller + kurma-agent, real netlink, %d ports)\n", n)
	fmt.Printf("  create->UP latency  p50 %7.2f ms   p99 %7.2f ms   (goal p99 <= 20 ms)\n", benchutil.Ms(p50), benchutil.Ms(p99))
	fmt.Printf("    of which the POST p50 %7.2f ms   p99 %7.2f ms   (controller alone)\n", benchutil.Ms(benchutil.Samples(posts).Pct(0.50)), benchutil.Ms(benchutil.Samples(posts).Pct(0.99)))
	fmt.Printf("  plug rate (bulk)    %7.1f ports/s\n", rate)
	fmt.Printf("peer: upstream CNI bridge plugin + host-local, sequential ADD, %d netns\n", n)
	fmt.Printf("  ADD latency         p50 %7.2f ms   p99 %7.2f ms\n", benchutil.Ms(q50), benchutil.Ms(q99))
	fmt.Printf("  ADD rate            %7.1f ports/s\n", peerRate)
	fmt.Printf("ratio: latency p50 agent/bridge %.2f, p99 %.2f; rate agent/bridge %.2f\n",
		benchutil.Ms(p50)/benchutil.Ms(q50), benchutil.Ms(p99)/benchutil.Ms(q99), rate/peerRate)
	return nil
}

func (b *bench) start(logPath, bin string, args ...string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", b.hostN, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return err
	}
	b.procs = append(b.procs, cmd)
	return nil
}

func nsHTTPClient(nsPath string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
				var err error
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

func waitReady(ctx context.Context, c *controllerapi.Client) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.ListHosts(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller not ready: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createUp returns the time from POST to UP, and the time the POST alone
// took (the controller's share before the agent can start).
func createUp(ctx context.Context, c *controllerapi.Client, pid string, p controllerapi.Port) (time.Duration, time.Duration, error) {
	start := time.Now()
	got, err := c.CreatePort(ctx, pid, p)
	if err != nil {
		return 0, 0, err
	}
	post := time.Since(start)
	for got.Status != controllerapi.StatusUp {
		if got, err = c.WaitPort(ctx, pid, got.ID, controllerapi.StatusUp, 10*time.Second); err != nil {
			return 0, 0, err
		}
		if got.Status == controllerapi.StatusError || time.Since(start) > 30*time.Second {
			return 0, 0, fmt.Errorf("port %s: %s %s", got.ID, got.Status, got.StatusReason)
		}
	}
	return time.Since(start), post, nil
}

func waitAllUp(ctx context.Context, c *controllerapi.Client, pid string, ps []controllerapi.Port) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(ps))
	sem := make(chan struct{}, 32)
	for _, p := range ps {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				got, err := c.WaitPort(ctx, pid, p.ID, controllerapi.StatusUp, 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if got.Status == controllerapi.StatusUp {
					return
				}
				if got.Status == controllerapi.StatusError || time.Now().After(deadline) {
					errs <- fmt.Errorf("port %s: %s %s", got.ID, got.Status, got.StatusReason)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// peer runs the upstream bridge plugin's ADD n times, sequentially, each
// into a fresh namespace, from inside the host namespace.
func (b *bench) peer(ctx context.Context, n int) ([]time.Duration, float64, error) {
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = "bin"
	}
	cniDir, _ := filepath.Abs(filepath.Join(dir, "cni"))
	if _, err := os.Stat(filepath.Join(cniDir, "bridge")); err != nil {
		return nil, 0, fmt.Errorf("upstream CNI plugins not built (make tools): %w", err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"kagtbench","type":"bridge","bridge":"kagtcni0","isGateway":true,`+
		`"ipam":{"type":"host-local","subnet":"10.65.0.0/16","dataDir":%q}}`, filepath.Join(b.dir, "ipam"))
	nss := make([]string, n)
	for i := range nss {
		var err error
		if nss[i], err = b.newNS(); err != nil {
			return nil, 0, err
		}
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i, p := range nss {
		t0 := time.Now()
		err := ns.WithNetNSPath("/run/netns/"+b.hostN, func(ns.NetNS) error {
			cmd := exec.CommandContext(ctx, filepath.Join(cniDir, "bridge"))
			cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + fmt.Sprintf("kagtb%d", i), "CNI_NETNS=" + p,
				"CNI_IFNAME=eth0", "CNI_PATH=" + cniDir}
			cmd.Stdin = bytes.NewReader([]byte(conf))
			out, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("bridge ADD: %w: %s", err, out)
			}
			return nil
		})
		if err != nil {
			return nil, 0, err
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, float64(n) / time.Since(start).Seconds(), nil
}
