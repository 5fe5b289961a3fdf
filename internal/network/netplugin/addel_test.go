package netplugin_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/uuid"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/testutil"
)

func TestAddDel(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetNS(t)
	id := uuid.NewString()
	conf := e.bridgeConf(nil)

	res := e.mustAdd(conf, pod, id, "eth0")
	if len(res.IPs) != 1 {
		t.Fatalf("result has %d IPs: %+v", len(res.IPs), res)
	}
	ip := res.IPs[0].Address
	if !netip.MustParsePrefix(e.subnet).Contains(netip.MustParseAddr(ip.IP.String())) {
		t.Fatalf("address %s not in %s", ip.String(), e.subnet)
	}
	if got := addrsOf(t, pod, "eth0"); !slices.Contains(got, ip.String()) {
		t.Fatalf("pod eth0 has %v, want %s", got, ip.String())
	}
	if v := links(t, e.host, "veth"); len(v) != 1 {
		t.Fatalf("host side has veths %v, want one", v)
	}
	if !slices.Contains(links(t, e.host, "bridge"), e.bridge) {
		t.Fatalf("bridge %s missing", e.bridge)
	}
	if a := e.allocated(); !slices.Equal(a, []string{ip.IP.String()}) {
		t.Fatalf("host-local holds %v", a)
	}
	if !hasPrefix(e.leftovers(), "cache/results/"+e.netName+"-"+id) {
		t.Fatalf("no cached result for del: %v", e.leftovers())
	}

	// A second add for the same pod and interface is refused and leaves
	// the live attachment alone.
	if r := e.run(e.add, conf, pod.Path(), id, "eth0"); r.code == 0 || !strings.Contains(r.stdout, "already attached") {
		t.Fatalf("second add: exit %d, stdout %s", r.code, r.stdout)
	}
	if got := addrsOf(t, pod, "eth0"); !slices.Contains(got, ip.String()) {
		t.Fatalf("after a refused second add, pod eth0 has %v, want %s", got, ip.String())
	}
	if a := e.allocated(); len(a) != 1 {
		t.Fatalf("after a refused second add, host-local holds %v", a)
	}

	for i := range 2 { // del twice is fine
		e.mustDel(conf, pod, id, "eth0")
		if v := links(t, e.host, "veth"); len(v) != 0 {
			t.Fatalf("del %d: veths left %v", i, v)
		}
		if l := addrsOf(t, pod, "eth0"); l != nil {
			t.Fatalf("del %d: pod still has eth0 %v", i, l)
		}
		if a := e.allocated(); len(a) != 0 {
			t.Fatalf("del %d: IPs still allocated %v", i, a)
		}
		if l := e.leftovers(); len(l) != 0 {
			t.Fatalf("del %d: state left %v", i, l)
		}
	}
}

func TestResultVersionFollowsConfig(t *testing.T) {
	for _, ver := range []string{"0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			e := newEnv(t)
			pod := testutil.NewNetNS(t)
			conf := e.bridgeConf(map[string]any{"cniVersion": ver})
			id := uuid.NewString()
			r := e.run(e.add, conf, pod.Path(), id, "eth0")
			if r.code != 0 {
				t.Fatalf("add: %d %s %s", r.code, r.stdout, r.stderr)
			}
			var v struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.CNIVersion != ver {
				t.Fatalf("result %s: version %q, want %q (%v)", r.stdout, v.CNIVersion, ver, err)
			}
			// Whatever the version, the daemon's parser reads the address.
			res, err := netconf.ParseResult([]byte(r.stdout))
			if err != nil || len(res.IPs) != 1 {
				t.Fatalf("ParseResult(%s) = %+v, %v", r.stdout, res, err)
			}
			e.mustDel(conf, pod, "unknown-pod", "eth0") // unknown pod: still fine
			e.mustDel(conf, pod, id, "eth0")
		})
	}
}

func TestTwoPodsTCP(t *testing.T) {
	e := newEnv(t)
	conf := e.bridgeConf(nil)
	p1, p2 := testutil.NewNetNS(t), testutil.NewNetNS(t)
	r1 := e.mustAdd(conf, p1, uuid.NewString(), "eth0")
	e.mustAdd(conf, p2, uuid.NewString(), "eth0")
	addr := net.JoinHostPort(r1.IPs[0].Address.IP.String(), "7777")

	var ln net.Listener
	if err := p1.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "hello from pod1")
	}()
	var got []byte
	if err := p2.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err = io.ReadAll(c)
		return err
	}); err != nil {
		t.Fatalf("pod2 -> pod1 %s: %v", addr, err)
	}
	if string(got) != "hello from pod1" {
		t.Fatalf("read %q", got)
	}
}

func TestChain(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetNS(t)
	id := uuid.NewString()
	bridge := map[string]any{"type": "bridge", "bridge": e.bridge, "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "subnet": e.subnet, "dataDir": e.ipamDir}}
	tuning := map[string]any{"type": "tuning", "mtu": 1400, "mac": "02:42:0a:00:00:42"}
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.netName, "check": true,
		"plugins": []any{bridge, tuning}})

	res := e.mustAdd(conf, pod, id, "net1")
	if len(res.IPs) != 1 {
		t.Fatalf("chain result %+v", res)
	}
	var mtu int
	var mac string
	if err := pod.Do(func(ns.NetNS) error {
		ifc, err := net.InterfaceByName("net1")
		if err != nil {
			return err
		}
		mtu, mac = ifc.MTU, ifc.HardwareAddr.String()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if mtu != 1400 || mac != "02:42:0a:00:00:42" {
		t.Fatalf("tuning not applied: mtu %d mac %s", mtu, mac)
	}
	// An explicit check call succeeds on the live attachment.
	if r := e.run(e.main, conf, "check", pod.Path(), id, "net1"); r.code != 0 {
		t.Fatalf("check: %d %s %s", r.code, r.stdout, r.stderr)
	}
	e.mustDel(conf, pod, id, "net1")
	if v := links(t, e.host, "veth"); len(v) != 0 {
		t.Fatalf("veths left %v", v)
	}
	if a := e.allocated(); len(a) != 0 {
		t.Fatalf("IPs left %v", a)
	}
}

func TestBadInputLeavesNothing(t *testing.T) {
	e := newEnv(t)
	pod := testutil.NewNetNS(t)
	good := func(extra map[string]any) []byte { return e.bridgeConf(extra) }
	chainWithMissing, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.netName, "plugins": []any{
		map[string]any{"type": "bridge", "bridge": e.bridge, "ipam": map[string]any{"type": "host-local", "subnet": e.subnet, "dataDir": e.ipamDir}},
		map[string]any{"type": "knetnosuchplugin"}}})
	// tuning fails on an unknown sysctl after bridge has set up the veth
	// and host-local has given an address: the rollback must undo both.
	chainFailsLate, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": e.netName, "plugins": []any{
		map[string]any{"type": "bridge", "bridge": e.bridge, "ipam": map[string]any{"type": "host-local", "subnet": e.subnet, "dataDir": e.ipamDir}},
		map[string]any{"type": "tuning", "sysctl": map[string]string{"net.ipv4.conf.IFNAME.knet-bad-sysctl": "1"}}}})
	tests := []struct {
		name string
		conf []byte
		args []string
		code int
		want string
	}{
		{"not json", []byte("{oops"), nil, 7, "network config"},
		{"empty", nil, nil, 7, "empty"},
		{"no type", []byte(`{"cniVersion":"1.0.0","name":"knetx"}`), nil, 7, "type"},
		{"no version", []byte(`{"name":"knetx","type":"bridge"}`), nil, 7, "cniVersion"},
		{"path type", []byte(`{"cniVersion":"1.0.0","name":"knetx","type":"../bridge"}`), nil, 7, "plain executable"},
		{"check old version", good(map[string]any{"cniVersion": "0.3.1", "check": true}), nil, 7, "0.4.0"},
		{"unknown plugin", good(map[string]any{"type": "knetnosuchplugin"}), nil, 7, "knetnosuchplugin"},
		{"bad subnet", good(map[string]any{"ipam": map[string]any{"type": "host-local", "subnet": "10.0.0.0/99", "dataDir": e.ipamDir}}), nil, 0, "10.0.0.0/99"},
		{"chain with missing plugin", chainWithMissing, nil, 7, "knetnosuchplugin"},
		{"chain fails late", chainFailsLate, nil, 0, "knet-bad-sysctl"},
		{"bad ifname", good(nil), []string{pod.Path(), "pod1", "a/b"}, 4, "a/b"},
		{"too many args", good(nil), []string{pod.Path(), "pod1", "eth0", "x"}, 4, "usage"},
		{"relative netns", good(nil), []string{"proc/1/ns/net", "pod1", "eth0"}, 4, "absolute"},
		{"bad pod id", good(nil), []string{pod.Path(), "../x", "eth0"}, 4, "pod UUID"},
		{"missing netns", good(nil), []string{"/proc/knet-none/ns/net", "pod1", "eth0"}, 0, "knet-none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if args == nil {
				args = []string{pod.Path(), uuid.NewString(), "eth0"}
			}
			r := e.run(e.add, tc.conf, args...)
			if r.code == 0 {
				t.Fatalf("add succeeded: %s", r.stdout)
			}
			var cerr struct {
				Code uint   `json:"code"`
				Msg  string `json:"msg"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &cerr); err != nil {
				t.Fatalf("stdout is not a CNI error: %q", r.stdout)
			}
			if tc.code != 0 && cerr.Code != uint(tc.code) {
				t.Errorf("code %d, want %d (%s)", cerr.Code, tc.code, cerr.Msg)
			}
			if !strings.Contains(cerr.Msg, tc.want) || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("error does not mention %q:\nstdout %s\nstderr %s", tc.want, r.stdout, r.stderr)
			}
			if v := links(t, e.host, "veth"); len(v) != 0 {
				t.Errorf("veths left %v", v)
			}
			if l := links(t, pod, ""); len(l) != 1 {
				t.Errorf("pod links %v, want only lo", l)
			}
			if a := e.allocated(); len(a) != 0 {
				t.Errorf("IPs left %v", a)
			}
			if l := e.leftovers(); hasPrefix(l, "cache/") {
				t.Errorf("cache left %v", l)
			}
		})
	}
}

func TestConcurrentAdds(t *testing.T) {
	e := newEnv(t)
	conf := e.bridgeConf(nil)
	const n = 20
	pods := make([]ns.NetNS, n)
	ids := make([]string, n)
	for i := range pods {
		pods[i], ids[i] = testutil.NewNetNS(t), uuid.NewString()
	}
	ips := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := e.run(e.add, conf, pods[i].Path(), ids[i], "eth0")
			if r.code != 0 {
				errs[i] = fmt.Errorf("add %d: %s %s", i, r.stdout, r.stderr)
				return
			}
			var res struct {
				IPs []struct{ Address string } `json:"ips"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res.IPs) != 1 {
				errs[i] = fmt.Errorf("add %d: result %s", i, r.stdout)
				return
			}
			ips[i] = res.IPs[0].Address
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range n {
			e.run(e.del, conf, pods[i].Path(), ids[i], "eth0")
		}
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for _, ip := range ips {
		if seen[ip] {
			t.Fatalf("address %s given twice: %v", ip, ips)
		}
		seen[ip] = true
	}
	if v := links(t, e.host, "veth"); len(v) != n {
		t.Fatalf("%d veths, want %d", len(v), n)
	}
	for i := range n {
		wg.Go(func() {
			if r := e.run(e.del, conf, pods[i].Path(), ids[i], "eth0"); r.code != 0 {
				errs[i] = fmt.Errorf("del %d: %s %s", i, r.stdout, r.stderr)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if a := e.allocated(); len(a) != 0 {
		t.Fatalf("IPs left after concurrent dels: %v", a)
	}
	if v := links(t, e.host, "veth"); len(v) != 0 {
		t.Fatalf("veths left %v", v)
	}
}

// TestDefaultNetworkConfig runs the embedded default network's plugin
// config (netconf.Default) with only the host-specific names replaced by
// test ones: bridge, subnet, host-local dir. Masquerade stays on (nftables,
// inside the test's host namespace).
func TestDefaultNetworkConfig(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed")
	}
	e := newEnv(t)
	def, err := netconf.Default("file:///opt/kurma-netplugin.aci")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(def.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["name"], cfg["bridge"] = e.netName, e.bridge
	ipam := cfg["ipam"].(map[string]any)
	ipam["subnet"], ipam["dataDir"] = e.subnet, e.ipamDir
	conf, _ := json.Marshal(cfg)

	pod := testutil.NewNetNS(t)
	id := uuid.NewString()
	ifname, err := def.Interface.Render(netconf.RenderOptions{PodUUID: id, Existing: []string{"lo"}})
	if err != nil {
		t.Fatal(err)
	}
	res := e.mustAdd(conf, pod, id, ifname)
	if len(res.IPs) != 1 || len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" {
		t.Fatalf("result %+v", res)
	}
	if got := addrsOf(t, pod, "eth0"); len(got) != 1 {
		t.Fatalf("pod eth0 addresses %v", got)
	}
	if rs := e.nftRuleset(); !strings.Contains(rs, "masquerade") {
		t.Fatalf("no masquerade rule:\n%s", rs)
	}
	e.mustDel(conf, pod, id, ifname)
	if rs := e.nftRuleset(); strings.Contains(rs, res.IPs[0].Address.IP.String()) {
		t.Fatalf("rule left after del:\n%s", rs)
	}
}
