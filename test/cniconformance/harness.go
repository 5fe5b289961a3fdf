package cniconformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/testutil"
)

// AllVersions are the CNI spec versions the harness knows.
var AllVersions = []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// InvalidConfig is a config the plugin must reject on ADD with CNI error
// Code (0: any non-zero code).
type InvalidConfig struct {
	Name   string
	Config []byte
	Code   uint
}

// Plugin describes a plugin (or a chain) under test.
type Plugin struct {
	// Type is the main plugin's type (binary name).
	Type string
	// Path lists the folders holding the plugin binaries (CNI_PATH).
	Path []string
	// Versions to test; default AllVersions.
	Versions []string
	// Config returns a network config (a single plugin config or a
	// conflist) for cniVersion v. Each call should give a fresh network
	// (unique name, bridge, IPAM data dir...), which the harness then uses
	// for one whole sub-test.
	Config func(t testing.TB, v string) []byte
	// InvalidConfigs returns configs ADD must reject for cniVersion v.
	InvalidConfigs func(t testing.TB, v string) []InvalidConfig
	// ExternalState returns the plugin's state outside network namespaces
	// for the network config conf (IPAM files, controller ports...), one
	// string per item. An ADD→DEL cycle must leave it as it was.
	ExternalState func(t testing.TB, conf []byte) []string
	// HostMarkers: with HostNetNS, host snapshot lines naming one of these
	// (e.g. the agent's link prefix or nft table) are compared too.
	HostMarkers []string
	// TransientHostState: per-network host state (a gateway bridge, a
	// VXLAN device) exists only while the network has attachments, so
	// every check compares with the state taken before the first ADD
	// (checks then run one at a time).
	TransientHostState bool
	// idle is the TransientHostState baseline, taken before the first ADD.
	idle *state

	// Settle is how long state may take to converge after DEL (an agent
	// that unplugs asynchronously); 0 for synchronous plugins.
	Settle time.Duration
	// HostNetNS: false runs the plugin in a private host netns the harness
	// creates; true runs it in the test's own (the real host) netns.
	HostNetNS bool
	// GCReleases says the plugin's GC removes the state of attachments that
	// are not valid (false: GC must only succeed).
	GCReleases bool
	// Parallel runs the per-version sub-tests in parallel (only for plugins
	// in a private host netns, whose checks cannot see each other).
	Parallel bool
	// Concurrency is the number of concurrent ADDs (default 4).
	Concurrency int
	// Timeout bounds each plugin call (default 30s).
	Timeout time.Duration
	// ErrorsHaveVersion: error JSON must carry "cniVersion" (spec 1.x;
	// upstream skel omits it).
	ErrorsHaveVersion bool
	// Prepare, when set, readies each new container before its first
	// use: e.g. sets its CNI_ARGS and creates the Kubernetes pod a
	// Kubernetes driver looks up.
	Prepare func(t testing.TB, c *Container)
	// Tolerate marks known deviations: a state line that differs after the
	// named check is logged, not failed, when it returns true. Use it only
	// for documented upstream behaviour.
	Tolerate func(check, line string) bool
}

// Env is one network under test: a config, a host netns and a libcni
// cache.
type Env struct {
	t       testing.TB
	P       *Plugin
	Version string
	Conf    []byte
	List    *libcni.NetworkConfigList
	CNI     *libcni.CNIConfig
	Host    ns.NetNS // nil when HostNetNS
}

// NewEnv prepares a network for cniVersion v.
func NewEnv(t testing.TB, p *Plugin, v string) *Env {
	t.Helper()
	testutil.RequireRoot(t)
	conf := p.Config(t, v)
	list, err := ParseConfList(conf)
	if err != nil {
		t.Fatalf("parse config: %v\n%s", err, conf)
	}
	e := &Env{t: t, P: p, Version: v, Conf: conf, List: list, CNI: libcni.NewCNIConfigWithCacheDir(p.Path, t.TempDir(), nil)}
	if !p.HostNetNS {
		e.Host = testutil.NewNetNS(t)
	}
	return e
}

// ParseConfList reads a conflist, or a single plugin config wrapped into
// one.
func ParseConfList(conf []byte) (*libcni.NetworkConfigList, error) {
	var probe struct {
		Plugins json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &probe); err != nil {
		return nil, err
	}
	if probe.Plugins != nil {
		return libcni.NetworkConfFromBytes(conf)
	}
	pc, err := libcni.NetworkPluginConfFromBytes(conf)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(pc)
}

func (e *Env) timeout() time.Duration {
	if e.P.Timeout > 0 {
		return e.P.Timeout
	}
	return 30 * time.Second
}

// inHost runs fn in the host netns the plugin should see.
func (e *Env) inHost(fn func() error) error {
	if e.Host == nil {
		return fn()
	}
	return e.Host.Do(func(ns.NetNS) error { return fn() })
}

// HostPath is the host netns path to snapshot ("" for the real host).
func (e *Env) HostPath() string {
	if e.Host == nil {
		return ""
	}
	return e.Host.Path()
}

// Container is one attachment: a container id, its netns and interface.
type Container struct {
	ID     string
	NetNS  ns.NetNS
	IfName string
	Args   [][2]string
}

// NewContainer creates a netns for a new container (removed at cleanup).
func (e *Env) NewContainer() *Container {
	c := &Container{ID: testutil.UniqueName("kcni") + testutil.UniqueName(""), NetNS: testutil.NewNetNS(e.t), IfName: "eth0"}
	if e.P.Prepare != nil {
		e.P.Prepare(e.t, c)
	}
	return c
}

// RuntimeConf builds libcni's arguments for c; netns "" when c.NetNS is nil.
func (c *Container) RuntimeConf() *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: c.ID, IfName: c.IfName, Args: c.Args}
	if c.NetNS != nil {
		rt.NetNS = c.NetNS.Path()
	}
	return rt
}

// Add runs ADD for c.
func (e *Env) Add(c *Container) (types.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	var res types.Result
	err := e.inHost(func() error {
		var err error
		res, err = e.CNI.AddNetworkList(ctx, e.List, c.RuntimeConf())
		return err
	})
	return res, err
}

// Check runs CHECK for c.
func (e *Env) Check(c *Container) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	return e.inHost(func() error { return e.CNI.CheckNetworkList(ctx, e.List, c.RuntimeConf()) })
}

// Del runs DEL for c.
func (e *Env) Del(c *Container) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	return e.inHost(func() error { return e.CNI.DelNetworkList(ctx, e.List, c.RuntimeConf()) })
}

// GC runs GC with the given valid attachments.
func (e *Env) GC(valid []*Container) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	args := &libcni.GCArgs{}
	for _, c := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: c.ID, IfName: c.IfName})
	}
	return e.inHost(func() error { return e.CNI.GCNetworkList(ctx, e.List, args) })
}

// Status runs STATUS.
func (e *Env) Status() error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	return e.inHost(func() error { return e.CNI.GetStatusNetworkList(ctx, e.List) })
}

// External returns the plugin's external state for this network.
func (e *Env) External() []string {
	if e.P.ExternalState == nil {
		return nil
	}
	return e.P.ExternalState(e.t, e.Conf)
}

// ExecResult is a raw plugin invocation's outcome.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int
}

// Exec runs the plugin binary directly (no libcni) with the CNI_*
// environment, in the env's host netns.
func (e *Env) Exec(command string, c *Container, stdin []byte) ExecResult {
	e.t.Helper()
	bin, err := findBin(e.P.Path, e.P.Type)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_PATH=" + strings.Join(e.P.Path, ":"), "PATH=" + os.Getenv("PATH")}
	if c != nil {
		rt := c.RuntimeConf()
		var args []string
		for _, a := range rt.Args {
			args = append(args, a[0]+"="+a[1])
		}
		cmd.Env = append(cmd.Env, "CNI_CONTAINERID="+rt.ContainerID, "CNI_NETNS="+rt.NetNS,
			"CNI_IFNAME="+rt.IfName, "CNI_ARGS="+strings.Join(args, ";"))
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	var r ExecResult
	_ = e.inHost(func() error {
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			r.ExitCode = ee.ExitCode()
		case err != nil:
			e.t.Fatalf("exec %s: %v", bin, err)
		}
		return nil
	})
	r.Stdout, r.Stderr = so.Bytes(), se.Bytes()
	return r
}

func findBin(path []string, name string) (string, error) {
	for _, d := range path {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("plugin %q not found in %v", name, path)
}
