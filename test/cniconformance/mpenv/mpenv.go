package mpenv

import (
	"bufio"
	"context"
	"encoding/json"

	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kurma.dev/kurma/pkg/controllerapi"
)

// Options configures Start.
type Options struct {
	ControllerBin string // path of kurma-controller
	AgentBin      string // path of kurma-agent
	TmpDir        string // store, agent state, logs
	// Agent starts kurma-agent for HostID.
	Agent bool
	// HostID is binding:host_id (default "kcni-<rand>").
	HostID string
	// LinkPrefix is the agent's link prefix (1-5 chars, default "kcni").
	LinkPrefix string
	// NFTTable is the agent's nft table (default "kcni<rand>").
	NFTTable string
	Logger   *slog.Logger
}

// Env is a running control plane.
type Env struct {
	URL     string
	Client  *controllerapi.Client
	Project string
	VPC     string
	Subnet  string
	CIDR    string
	HostID  string
	// AgentMetrics is the agent's metrics base URL (/metrics, /healthz).
	AgentMetrics string
	opts         Options
	procs        []proc
	// ctl is the running controller; restarts counts RestartController.
	ctl      *exec.Cmd
	restarts int
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
}

func randHex(n int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = hex[rand.IntN(16)]
	}
	return string(b)
}

// Start launches the controller (and agent) and creates the network.
func Start(ctx context.Context, o Options) (_ *Env, retErr error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.HostID == "" {
		o.HostID = "kcni-" + randHex(8)
	}
	if o.LinkPrefix == "" {
		o.LinkPrefix = "kcni"
	}
	if o.NFTTable == "" {
		o.NFTTable = "kcni" + randHex(8)
	}
	e := &Env{HostID: o.HostID, opts: o}
	defer func() {
		if retErr != nil {
			e.Close()
		}
	}()
	addr, err := e.startController("127.0.0.1:0", "controller.log")
	if err != nil {
		return nil, err
	}
	e.URL = "http://" + addr
	if e.Client, err = controllerapi.New(e.URL); err != nil {
		return nil, err
	}
	if err := e.createNetwork(ctx); err != nil {
		return nil, err
	}
	if o.Agent {
		if err := e.startAgent(ctx); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// startController runs the controller on listen (its store in TmpDir) and
// returns the address it listens on.
func (e *Env) startController(listen, logName string) (string, error) {
	o := e.opts
	ctl := exec.Command(o.ControllerBin, "--listen", listen,
		"--store", "bolt:"+filepath.Join(o.TmpDir, "controller.db"), "--log-level", "info")
	addr, err := e.startAndScan(ctl, filepath.Join(o.TmpDir, logName), func(line string) (string, bool) {
		var m struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "controller listening" {
			return m.Addr, true
		}
		return "", false
	})
	if err != nil {
		return "", fmt.Errorf("start controller: %w", err)
	}
	e.ctl = ctl
	return addr, nil
}

// RestartController kills the controller with SIGKILL and starts it again
// on the same address and store (its log then goes to controller-<n>.log).
func (e *Env) RestartController() error {
	for i, p := range e.procs {
		if p.cmd != e.ctl {
			continue
		}
		_ = p.cmd.Process.Kill()
		<-p.done
		e.procs = append(e.procs[:i], e.procs[i+1:]...)
		break
	}
	e.restarts++
	_, err := e.startController(strings.TrimPrefix(e.URL, "http://"), fmt.Sprintf("controller-%d.log", e.restarts))
	return err
}

// startAndScan starts cmd with stderr copied to logPath and returns what
// match finds in the first stderr line it matches.
func (e *Env) startAndScan(cmd *exec.Cmd, logPath string, match func(string) (string, bool)) (string, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = logf
	// No Pdeathsig: it fires when the forking OS thread exits, and Go
	// retires threads (netns helpers lock and drop them).
	if err := cmd.Start(); err != nil {
		return "", err
	}
	pr2 := proc{cmd: cmd, done: make(chan struct{})}
	e.procs = append(e.procs, pr2)
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(logf, line)
			if !sent {
				if v, ok := match(line); ok {
					found <- v
					sent = true
				}
			}
		}
		_ = logf.Close()
	}()
	go func() { _ = cmd.Wait(); _ = pw.Close(); close(pr2.done) }()
	select {
	case v := <-found:
		return v, nil
	case <-time.After(15 * time.Second):
		b, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("%s did not start: %s", cmd.Path, b)
	}
}

func (e *Env) createNetwork(ctx context.Context) error {
	p, err := e.Client.CreateProject(ctx, controllerapi.Project{Name: "kcni-project"})
	if err != nil {
		return fmt.Errorf("create project: %w", err)
	}
	e.Project = p.ID
	v, err := e.Client.CreateVPC(ctx, p.ID, controllerapi.VPC{Name: "kcni-vpc"})
	if err != nil {
		return fmt.Errorf("create vpc: %w", err)
	}
	e.VPC = v.ID
	e.CIDR = fmt.Sprintf("10.%d.%d.0/24", 100+rand.IntN(100), rand.IntN(250))
	s, err := e.Client.CreateSubnet(ctx, p.ID, controllerapi.Subnet{Name: "kcni-subnet", NetworkID: v.ID, CIDR: e.CIDR, IPVersion: 4})
	if err != nil {
		return fmt.Errorf("create subnet: %w", err)
	}
	e.Subnet = s.ID
	return nil
}

func (e *Env) startAgent(ctx context.Context) error {
	o := e.opts
	cmd := exec.Command(o.AgentBin, "--controller", e.URL, "--host-id", o.HostID,
		"--underlay-ip", "127.0.0.1", "--state-dir", filepath.Join(o.TmpDir, "agent"),
		"--link-prefix", o.LinkPrefix, "--nft-table", o.NFTTable, "--metrics-listen", "127.0.0.1:0")
	addr, err := e.startAndScan(cmd, filepath.Join(o.TmpDir, "agent.log"), func(line string) (string, bool) {
		// slog's text format: ... msg="metrics listening" addr=127.0.0.1:PORT
		if !strings.Contains(line, `msg="metrics listening"`) {
			return "", false
		}
		_, a, _ := strings.Cut(line, " addr=")
		if f := strings.Fields(a); len(f) > 0 {
			return f[0], true
		}
		return "", false
	})
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	e.AgentMetrics = "http://" + addr
	// Ready once it has registered this host.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := e.Client.GetHost(ctx, o.HostID); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(o.TmpDir, "agent.log"))
			return fmt.Errorf("agent did not register host %s: %s", o.HostID, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Conf returns a mizarmp network config for this control plane.
func (e *Env) Conf(cniVersion, name string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":%q,"name":%q,"type":"mizarmp","mpurl":%q,"subnet":%q,"project":%q,"hostId":%q}`,
		cniVersion, name, e.URL, e.Subnet, e.Project, e.HostID)
}

// Ports lists this host's ports as "id device/ifname status".
func (e *Env) Ports(ctx context.Context) ([]string, error) {
	ps, err := e.Client.ListPorts(ctx, e.Project, controllerapi.PortFilter{HostID: e.HostID})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.ID+" "+p.DeviceID+"/"+p.VethName)
	}
	return out, nil
}

// Logs returns the processes' logs (for failure messages).
func (e *Env) Logs() string {
	var b strings.Builder
	logs := []string{"controller.log", "agent.log"}
	for i := 1; i <= e.restarts; i++ {
		logs = append(logs, fmt.Sprintf("controller-%d.log", i))
	}
	for _, f := range logs {
		if data, err := os.ReadFile(filepath.Join(e.opts.TmpDir, f)); err == nil {
			fmt.Fprintf(&b, "== %s\n%s", f, data)
		}
	}
	return b.String()
}

// Close stops the agent and the controller and removes what the agent
// left under our prefix.
func (e *Env) Close() {
	for i := len(e.procs) - 1; i >= 0; i-- {
		p := e.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	e.procs = nil
	if e.opts.Agent {
		e.removeAgentState()
	}
}

func (e *Env) removeAgentState() {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(name, e.opts.LinkPrefix) && len(e.opts.LinkPrefix) >= 4 {
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
	// The agent's isolation (inet) and port-guard (bridge) tables.
	for _, family := range []string{"inet", "bridge"} {
		_ = exec.Command("nft", "delete", "table", family, e.opts.NFTTable).Run()
	}
}
