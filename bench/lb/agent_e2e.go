package main

// The end-to-end agent figures of bench/lb: a real kurma-agent (its own
// process, in a host namespace) following an in-process controller, timed
// from the controller's 201 until the element is live in the kernel, read
// back through netlink; its RSS; and its cold sync after kill -9.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/controller/api"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

type e2eRow struct {
	n                  int
	post50, post99     time.Duration // the POST alone
	live50, live99     time.Duration // 201 -> element live
	tot50, tot99       time.Duration // POST sent -> element live
	rssKiB             int64
	restart            time.Duration // agent start -> a change made while it was down is live
	restartMeasuredAtN bool
}

func runAgentE2E(ctx context.Context, sizes []int, creates int) ([]e2eRow, error) {
	b := &agentBench{pods: map[string]string{}}
	defer b.cleanup()
	host, err := b.newNS()
	if err != nil {
		return nil, err
	}
	h := nsName(host)
	for _, args := range [][]string{
		{"ip", "-n", h, "link", "add", "klbbu0", "type", "veth", "peer", "name", "klbbu1"},
		{"ip", "-n", h, "link", "set", "klbbu1", "up"},
		{"ip", "-n", h, "addr", "add", "192.0.2.1/24", "dev", "klbbu0"},
		{"ip", "-n", h, "link", "set", "klbbu0", "up"},
	} {
		if err := runCmd(args[0], args[1:]...); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "klbb")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	agentBin, err := findBin(dir, "kurma-agent")
	if err != nil {
		return nil, err
	}
	// The controller, in this process, listening inside the host namespace.
	st, err := boltstore.Open(filepath.Join(dir, "ctl.db"), boltstore.Options{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	srv, err := api.New(api.Config{Store: st})
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Run(sctx)
	var ln net.Listener
	if err := ns.WithNetNSPath(host, func(ns.NetNS) error {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	url := "http://" + ln.Addr().String()
	cli, err := capi.New(url, capi.WithHTTPClient(nsClient(host)))
	if err != nil {
		return nil, err
	}
	if _, err := cli.CreateProject(ctx, capi.Project{ID: benchPID}); err != nil {
		return nil, err
	}
	if _, err := cli.CreateVPC(ctx, benchPID, capi.VPC{ID: benchVPC, CIDR: "10.0.0.0/9"}); err != nil {
		return nil, err
	}
	if _, err := cli.CreateSubnet(ctx, benchPID, capi.Subnet{ID: "pods", NetworkID: benchVPC, CIDR: "10.1.0.0/16"}); err != nil {
		return nil, err
	}
	if _, err := cli.CreateSubnet(ctx, benchPID, capi.Subnet{ID: "svc", NetworkID: benchVPC, CIDR: "10.96.0.0/12", Purpose: capi.SubnetPurposeService}); err != nil {
		return nil, err
	}
	var agent *exec.Cmd
	startAgent := func() error {
		agent = exec.Command("ip", "netns", "exec", h, agentBin, "--controller", url, "--host-id", "bench",
			"--underlay-ip", "192.0.2.1", "--underlay-dev", "klbbu0", "--state-dir", filepath.Join(dir, "agent"),
			"--link-prefix", "kb", "--nft-table", "klbbiso", "--resync", "60s")
		log, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		agent.Stdout, agent.Stderr = log, log
		return agent.Start()
	}
	stopAgent := func() {
		if agent != nil && agent.Process != nil {
			_ = agent.Process.Kill() // kill -9
			_ = agent.Wait()
		}
	}
	if err := startAgent(); err != nil {
		return nil, err
	}
	defer stopAgent()
	// A local port makes the VPC's load balancers this host's to program.
	podNS, err := b.newNS()
	if err != nil {
		return nil, err
	}
	port, err := cli.CreatePort(ctx, benchPID, capi.Port{NetworkID: "pods", VethName: "eth0", NetworkNS: podNS, BindingHostID: "bench"})
	if err != nil {
		return nil, err
	}
	if _, err := cli.WaitPort(ctx, benchPID, port.ID, capi.StatusUp, 30*time.Second); err != nil {
		return nil, err
	}
	conn, err := b.nfConnAt(host)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	live := func(lb *capi.LoadBalancer, timeout time.Duration) error {
		vip := netip.MustParseAddr(lb.VIPAddress)
		key := svcKeyBytes(fmt.Sprintf("kbb%06x", lb.VNI), vip, 6, 80)
		deadline := time.Now().Add(timeout)
		for {
			for _, set := range []string{"services-a", "services-b"} {
				if _, ok, err := benchutil.GetElem(conn, "klbbiso", set, key); err != nil {
					return err
				} else if ok {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("load balancer %s (%s) not live after %v", lb.ID, lb.VIPAddress, timeout)
			}
		}
	}
	lbOf := func(id string, i int) capi.LoadBalancer {
		return capi.LoadBalancer{ID: id, VIPSubnetID: "svc", Listeners: []capi.Listener{{Protocol: capi.ProtocolTCP, Port: 80, TargetPort: 8080}},
			Members: membersOf(i, 2)}
	}
	var rows []e2eRow
	stored, seq := 0, 0
	for _, n := range sizes {
		var last *capi.LoadBalancer
		for stored < n {
			var batch []capi.LoadBalancer
			for ; stored < n && len(batch) < 5000; stored++ {
				batch = append(batch, lbOf("fill-"+strconv.Itoa(stored), stored))
			}
			got, err := cli.CreateLoadBalancers(ctx, benchPID, batch)
			if err != nil {
				return nil, fmt.Errorf("fill: %w", err)
			}
			last = &got[len(got)-1]
		}
		if last != nil {
			if err := live(last, 2*time.Minute); err != nil {
				return nil, err
			}
		}
		r := e2eRow{n: n}
		var posts, lives, tots benchutil.Samples
		for range creates {
			seq++
			t0 := time.Now()
			lb, err := cli.CreateLoadBalancer(ctx, benchPID, lbOf("x-"+strconv.Itoa(seq), 1_000_000+seq))
			if err != nil {
				return nil, err
			}
			t1 := time.Now()
			if err := live(lb, 10*time.Second); err != nil {
				return nil, err
			}
			posts = append(posts, t1.Sub(t0))
			lives = append(lives, time.Since(t1))
			tots = append(tots, time.Since(t0))
			stored++
		}
		r.post50, r.post99 = posts.Pct(0.50), posts.Pct(0.99)
		r.live50, r.live99 = lives.Pct(0.50), lives.Pct(0.99)
		r.tot50, r.tot99 = tots.Pct(0.50), tots.Pct(0.99)
		if rss, err := pidRSS(agent.Process.Pid); err == nil {
			r.rssKiB = rss
		}
		// kill -9, one change while down, start: until that change is live.
		stopAgent()
		seq++
		lb, err := cli.CreateLoadBalancer(ctx, benchPID, lbOf("x-"+strconv.Itoa(seq), 1_000_000+seq))
		if err != nil {
			return nil, err
		}
		stored++
		t0 := time.Now()
		if err := startAgent(); err != nil {
			return nil, err
		}
		if err := live(lb, 2*time.Minute); err != nil {
			return nil, err
		}
		r.restart = time.Since(t0)
		r.restartMeasuredAtN = true
		rows = append(rows, r)
		fmt.Printf("  e2e %6d LBs: 201->live p50 %s p99 %s; POST sent->live p50 %s p99 %s (the POST alone p50 %s p99 %s); agent RSS %.1f MiB; kill -9, restart -> converged %s\n",
			n, ms(r.live50), ms(r.live99), ms(r.tot50), ms(r.tot99), ms(r.post50), ms(r.post99), float64(r.rssKiB)/1024, ms(r.restart))
	}
	return rows, nil
}

func nsClient(nsPath string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 16,
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

// findBin returns $KURMA_BIN_DIR/name (or bin/name), else builds it.
func findBin(dir, name string) (string, error) {
	if p, err := filepath.Abs(filepath.Join(benchutil.BinDir(), name)); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	out := filepath.Join(dir, name)
	if err := runCmd("go", "build", "-o", out, "./cmd/"+name); err != nil {
		return "", err
	}
	return out, nil
}

func pidRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseRSS(string(b))
}

func (b *agentBench) nfConnAt(nsPath string) (*mnl.Conn, error) {
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mnl.Dial(unix.NETLINK_NETFILTER, &mnl.Config{NetNS: int(f.Fd())})
}
