package netplugin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/testutil"
)

// pluginsNeeded are the upstream CNI plugins these tests call.
var pluginsNeeded = []string{"bridge", "host-local", "loopback", "tuning", "portmap"}

var buildCNIOnce struct {
	sync.Once
	dir string
	err error
}

// cniDir returns a folder holding the upstream CNI plugins: bin/cni from
// `make build`, or, when that is missing, a one-off build for this run.
func cniDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "bin")
	}
	dir = filepath.Join(dir, "cni")
	missing := false
	for _, p := range pluginsNeeded {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			missing = true
		}
	}
	if !missing {
		return dir
	}
	buildCNIOnce.Do(func() {
		out, err := os.MkdirTemp("", "knet-cni-")
		if err != nil {
			buildCNIOnce.err = err
			return
		}
		for _, p := range pluginsNeeded {
			pkg := "github.com/containernetworking/plugins/plugins/main/" + p
			switch p {
			case "host-local":
				pkg = "github.com/containernetworking/plugins/plugins/ipam/host-local"
			case "tuning", "portmap":
				pkg = "github.com/containernetworking/plugins/plugins/meta/" + p
			}
			cmd := exec.Command("go", "build", "-o", filepath.Join(out, p), pkg)
			cmd.Dir = testutil.RepoRoot(t)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				buildCNIOnce.err = fmt.Errorf("build %s: %v\n%s", p, err, b)
				return
			}
		}
		buildCNIOnce.dir = out
	})
	if buildCNIOnce.err != nil {
		t.Fatalf("CNI plugins missing in %s and could not be built: %v", dir, buildCNIOnce.err)
	}
	return buildCNIOnce.dir
}

// env is one test's plugin setup: the add/del binaries, a host namespace
// standing in for the host (bridges and masquerade rules live there), a
// state dir and a host-local data dir.
type env struct {
	t        *testing.T
	add, del string
	main     string
	host     ns.NetNS
	cniPath  string
	state    string
	ipamDir  string
	bridge   string
	subnet   string
	netName  string
}

var subnetSeq struct {
	sync.Mutex
	n int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	bin := testutil.Bin(t, "kurma-netplugin")
	dir := t.TempDir()
	e := &env{t: t, host: testutil.NewNetNS(t), cniPath: cniDir(t),
		state: filepath.Join(dir, "state"), ipamDir: filepath.Join(dir, "ipam"),
		bridge: testutil.UniqueName("knetbr"), netName: testutil.UniqueName("knet")}
	for _, n := range []string{"add", "del", "netplugin"} {
		if err := os.Symlink(bin, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	e.add, e.del, e.main = filepath.Join(dir, "add"), filepath.Join(dir, "del"), filepath.Join(dir, "netplugin")
	// Registered first, so it runs last: after every del the test queued,
	// nothing of this test may be left.
	t.Cleanup(func() {
		if l := e.leftovers(); len(l) != 0 {
			t.Errorf("leaked plugin state: %v", l)
		}
		if a := e.allocated(); len(a) != 0 {
			t.Errorf("leaked addresses: %v", a)
		}
		if v := links(t, e.host, "veth"); len(v) != 0 {
			t.Errorf("leaked veths: %v", v)
		}
	})
	// Subnets are only ever used inside this test's namespaces; vary them
	// anyway so that parallel tests never look alike.
	subnetSeq.Lock()
	subnetSeq.n++
	e.subnet = fmt.Sprintf("10.%d.%d.0/24", 200+(os.Getpid()%50), subnetSeq.n%250)
	subnetSeq.Unlock()
	return e
}

// bridgeConf is a single bridge+host-local config; extra keys are merged.
func (e *env) bridgeConf(extra map[string]any) []byte {
	c := map[string]any{
		"cniVersion": "1.0.0", "name": e.netName, "type": "bridge", "bridge": e.bridge,
		"isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "subnet": e.subnet, "dataDir": e.ipamDir},
	}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

type callResult struct {
	code           int
	stdout, stderr string
}

// run executes an add/del binary inside the test's host namespace, as the
// networking pod (which shares the host's namespace) would.
func (e *env) run(bin string, conf []byte, args ...string) callResult {
	e.t.Helper()
	var res callResult
	err := e.host.Do(func(ns.NetNS) error {
		cmd := exec.Command(bin, args...)
		cmd.Stdin = bytes.NewReader(conf)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Env = append(os.Environ(), "KURMA_CNI_PATH="+e.cniPath, "KURMA_NETWORK_STATE_DIR="+e.state)
		err := cmd.Run()
		res.stdout, res.stderr = out.String(), errb.String()
		if ee, ok := err.(*exec.ExitError); ok {
			res.code = ee.ExitCode()
			return nil
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("run %s: %v", bin, err)
	}
	return res
}

// mustAdd adds pod and returns the parsed result; the pod is deleted at
// cleanup (del is idempotent, so tests may delete it earlier).
func (e *env) mustAdd(conf []byte, pod ns.NetNS, uuid, ifname string) *netconf.Result {
	e.t.Helper()
	r := e.run(e.add, conf, pod.Path(), uuid, ifname)
	if r.code != 0 {
		e.t.Fatalf("add %s: exit %d\nstdout: %s\nstderr: %s", uuid, r.code, r.stdout, r.stderr)
	}
	e.t.Cleanup(func() { e.run(e.del, conf, pod.Path(), uuid, ifname) })
	res, err := netconf.ParseResult([]byte(r.stdout))
	if err != nil {
		e.t.Fatalf("add %s: result %q: %v", uuid, r.stdout, err)
	}
	return res
}

func (e *env) mustDel(conf []byte, pod ns.NetNS, uuid, ifname string) {
	e.t.Helper()
	if r := e.run(e.del, conf, pod.Path(), uuid, ifname); r.code != 0 {
		e.t.Fatalf("del %s: exit %d\nstdout: %s\nstderr: %s", uuid, r.code, r.stdout, r.stderr)
	}
}

// links lists the link names of a namespace by type ("veth", "bridge", ""
// for all).
func links(t *testing.T, n ns.NetNS, typ string) []string {
	t.Helper()
	var names []string
	err := n.Do(func(ns.NetNS) error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			if typ == "" || l.Type() == typ {
				names = append(names, l.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// addrsOf returns the IPv4 addresses (CIDR) on ifname inside n, or nil when
// the link does not exist.
func addrsOf(t *testing.T, n ns.NetNS, ifname string) []string {
	t.Helper()
	var out []string
	err := n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return nil
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range as {
			out = append(out, a.IPNet.String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// allocated lists the addresses host-local holds for the test network.
func (e *env) allocated() []string {
	e.t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.ipamDir, e.netName))
	if err != nil && !os.IsNotExist(err) {
		e.t.Fatal(err)
	}
	var ips []string
	for _, de := range ents {
		if net.ParseIP(de.Name()) != nil {
			ips = append(ips, de.Name())
		}
	}
	return ips
}

// cached lists libcni cache entries and lock files left in the state dir.
func (e *env) leftovers() []string {
	e.t.Helper()
	var out []string
	for _, sub := range []string{"cache/results", "locks"} {
		ents, _ := os.ReadDir(filepath.Join(e.state, sub))
		for _, de := range ents {
			out = append(out, sub+"/"+de.Name())
		}
	}
	return out
}

func hasPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}
