package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
)

var pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kcni-mizarmp-")
	if err != nil {
		panic(err)
	}
	pluginBin = filepath.Join(dir, "mizarmp")
	cmd := exec.Command("go", "build", "-o", pluginBin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build mizarmp: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type call struct {
	cmd, cid, netns, ifname, args string
	conf                          []byte
}

type outcome struct {
	stdout []byte
	exit   int
}

// cniErr decodes error JSON; fails the test if stdout is not one.
func (o outcome) cniErr(t testing.TB) types.Error {
	t.Helper()
	var e struct {
		CNIVersion string `json:"cniVersion"`
		types.Error
	}
	if o.exit == 0 || json.Unmarshal(o.stdout, &e) != nil || e.Code == 0 || e.CNIVersion == "" {
		t.Fatalf("want CNI error JSON and exit 1, got exit %d: %s", o.exit, o.stdout)
	}
	return e.Error
}

func invoke(t testing.TB, c call) outcome {
	t.Helper()
	cmd := exec.Command(pluginBin)
	cmd.Env = []string{"CNI_COMMAND=" + c.cmd, "CNI_CONTAINERID=" + c.cid, "CNI_NETNS=" + c.netns,
		"CNI_IFNAME=" + c.ifname, "CNI_ARGS=" + c.args, "CNI_PATH=/nonexistent", "CNI_NETNS_OVERRIDE=1"}
	cmd.Stdin = bytes.NewReader(c.conf)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	o := outcome{stdout: out.Bytes()}
	if ee, ok := err.(*exec.ExitError); ok {
		o.exit = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o
}

func stubConf(url, ver string, extra string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":%q,"name":"kcninet","type":"mizarmp","mpurl":%q,"subnet":"s1","project":"p1","hostId":"host-a"%s}`, ver, url, extra)
}

func TestAddDelEveryVersion(t *testing.T) {
	s := newStub(t)
	for _, v := range supportedVersions.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			conf := stubConf(s.srv.URL, v, `,"dns":{"search":["svc.local"]}`)
			c := call{cmd: "ADD", cid: "ctr-" + strings.ReplaceAll(v, ".", ""), netns: "/var/run/netns/kcnix", ifname: "eth0",
				args: "IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=sbx1;FOO=bar", conf: conf}
			o := invoke(t, c)
			if o.exit != 0 {
				t.Fatalf("ADD exit %d: %s", o.exit, o.stdout)
			}
			var res map[string]any
			if err := json.Unmarshal(o.stdout, &res); err != nil {
				t.Fatalf("result: %v: %s", err, o.stdout)
			}
			if res["cniVersion"] != v {
				t.Fatalf("result version %v: %s", res["cniVersion"], o.stdout)
			}
			raw := string(o.stdout)
			for _, want := range []string{"/24", "10.77.0.1"} {
				if !strings.Contains(raw, want) {
					t.Errorf("result lacks %q: %s", want, raw)
				}
			}
			if v >= "0.3.0" && !strings.Contains(raw, `"sandbox": "/var/run/netns/kcnix"`) && !strings.Contains(raw, `"sandbox":"/var/run/netns/kcnix"`) {
				t.Errorf("result lacks the interface sandbox: %s", raw)
			}
			if !strings.Contains(raw, "svc.local") || !strings.Contains(raw, "10.77.0.53") {
				t.Errorf("result lacks DNS: %s", raw)
			}

			// The port body follows spec 003.
			s.mu.Lock()
			var p *controllerapi.Port
			for _, q := range s.ports {
				if q.DeviceID == c.cid {
					p = q
				}
			}
			s.mu.Unlock()
			if p == nil {
				t.Fatal("no port created")
			}
			host, _ := os.Hostname()
			checks := map[string][2]string{
				"name":            {p.Name, "k8s_" + p.ID},
				"description":     {p.Description, "cni sbx1, ns:/var/run/netns/kcnix, host:" + host},
				"network_id":      {p.NetworkID, "s1"},
				"project_id":      {p.ProjectID, "p1"},
				"veth_name":       {p.VethName, "eth0"},
				"network_ns":      {p.NetworkNS, "/var/run/netns/kcnix"},
				"binding:host_id": {p.BindingHostID, "host-a"},
				"vnic_type":       {p.BindingVNICType, "normal"},
			}
			for k, g := range checks {
				if g[0] != g[1] {
					t.Errorf("port %s = %q, want %q", k, g[0], g[1])
				}
			}
			if p.AdminStateUp == nil || !*p.AdminStateUp || p.PortSecurityEnabled == nil || *p.PortSecurityEnabled || p.FastPath == nil || !*p.FastPath {
				t.Errorf("port flags wrong: %+v", p)
			}

			for i := range 2 {
				d := c
				d.cmd, d.netns = "DEL", ""
				if o := invoke(t, d); o.exit != 0 {
					t.Fatalf("DEL #%d: %s", i+1, o.stdout)
				}
			}
			s.mu.Lock()
			n := len(s.ports)
			s.mu.Unlock()
			if n != 0 {
				t.Fatalf("%d ports left after DEL", n)
			}
		})
	}
}

func TestAddWaits(t *testing.T) {
	tests := []struct {
		name     string
		longPoll bool
		final    string
		timeout  string
		wantCode uint // 0: success
		minGets  int
	}{
		{"create waits", true, controllerapi.StatusUp, "", 0, 0},
		{"polling fallback", false, controllerapi.StatusUp, "", 0, 2},
		{"port error rolls back", true, controllerapi.StatusError, "", types.ErrInternal, 0},
		{"timeout rolls back", true, "", "400ms", types.ErrTryAgainLater, 0},
		{"timeout without long poll", false, "", "400ms", types.ErrTryAgainLater, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStub(t)
			s.longPoll = tt.longPoll
			s.onCreate = func(p *controllerapi.Port) {
				if tt.final == "" {
					return
				}
				id := p.ID
				time.AfterFunc(150*time.Millisecond, func() { s.setStatus(id, tt.final) })
			}
			extra := ""
			if tt.timeout != "" {
				extra = `,"timeouts":{"up":"` + tt.timeout + `"}`
			}
			start := time.Now()
			o := invoke(t, call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: stubConf(s.srv.URL, "1.1.0", extra)})
			if tt.wantCode == 0 {
				if o.exit != 0 {
					t.Fatalf("ADD: %s", o.stdout)
				}
				if time.Since(start) < 150*time.Millisecond {
					t.Fatalf("ADD returned before the port was UP")
				}
			} else {
				if e := o.cniErr(t); e.Code != tt.wantCode {
					t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, tt.wantCode)
				}
				s.mu.Lock()
				n := len(s.ports)
				s.mu.Unlock()
				if n != 0 {
					t.Fatalf("failed ADD left %d ports", n)
				}
			}
			gets := 0
			for _, r := range s.requests() {
				if strings.HasPrefix(r, "GET /project/p1/ports/") {
					gets++
				}
			}
			// A controller that waits on create needs no GET of the
			// port at all; without it the plugin polls.
			if tt.longPoll && gets != 0 || gets < tt.minGets {
				t.Fatalf("%d GETs of the port, want %d (long poll %v): %v", gets, tt.minGets, tt.longPoll, s.requests())
			}
		})
	}
}

func TestUnreachableController(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	_ = l.Close() // nothing listens there now
	const budget = 300 * time.Millisecond
	conf := stubConf(url, "1.1.0", `,"timeouts":{"retry":"`+budget.String()+`"}`)
	for _, tt := range []struct {
		cmd  string
		code uint
	}{{"ADD", types.ErrTryAgainLater}, {"DEL", types.ErrTryAgainLater}, {"STATUS", types.ErrPluginNotAvailable}, {"GC", types.ErrTryAgainLater}} {
		t.Run(tt.cmd, func(t *testing.T) {
			start := time.Now()
			o := invoke(t, call{cmd: tt.cmd, cid: "c1", netns: "/x", ifname: "eth0", conf: conf})
			took := time.Since(start)
			if e := o.cniErr(t); e.Code != tt.code {
				t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, tt.code)
			}
			// Every verb but STATUS retries within the budget, and
			// no longer.
			if tt.cmd != "STATUS" && took < budget/2 || took > budget+5*time.Second {
				t.Fatalf("%s gave up after %v, with a retry budget of %v", tt.cmd, took, budget)
			}
		})
	}
}

func TestStatusReady(t *testing.T) {
	s := newStub(t)
	if o := invoke(t, call{cmd: "STATUS", conf: stubConf(s.srv.URL, "1.1.0", "")}); o.exit != 0 {
		t.Fatalf("STATUS: %s", o.stdout)
	}
	// An unknown subnet is not ready either.
	o := invoke(t, call{cmd: "STATUS", conf: bytes.Replace(stubConf(s.srv.URL, "1.1.0", ""), []byte(`"s1"`), []byte(`"s2"`), 1)})
	if e := o.cniErr(t); e.Code != types.ErrPluginNotAvailable {
		t.Fatalf("code %d", e.Code)
	}
}

func TestDelFindsForeignPortAndGC(t *testing.T) {
	s := newStub(t)
	conf := stubConf(s.srv.URL, "1.1.0", "")
	c, err := parseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id, cid, host, ifname string) {
		s.ports[id] = &controllerapi.Port{ID: id, Name: "k8s_" + id, DeviceID: cid, BindingHostID: host, VethName: ifname, NetworkID: "s1", Status: "UP"}
	}
	// A port with a random id (created elsewhere) for c1/eth0; ours for
	// c2 (valid), c3 (stale), and c4 on another host.
	mk("random-id", "c1", "host-a", "eth0")
	mk(portID(c, "c2", "eth0"), "c2", "host-a", "eth0")
	mk(portID(c, "c3", "eth0"), "c3", "host-a", "eth0")
	mk(portID(c, "c4", "eth0"), "c4", "host-b", "eth0")
	mk(portID(c, "c1", "eth1"), "c1", "host-a", "eth1")

	if o := invoke(t, call{cmd: "DEL", cid: "c1", ifname: "eth0", conf: conf}); o.exit != 0 {
		t.Fatalf("DEL: %s", o.stdout)
	}
	if _, ok := s.ports["random-id"]; ok {
		t.Fatal("DEL did not find the port by device_id and veth_name")
	}
	gc := bytes.Replace(conf, []byte(`"hostId"`), []byte(`"cni.dev/valid-attachments":[{"containerID":"c2","ifname":"eth0"},{"containerID":"c1","ifname":"eth1"}],"hostId"`), 1)
	if o := invoke(t, call{cmd: "GC", conf: gc}); o.exit != 0 {
		t.Fatalf("GC: %s", o.stdout)
	}
	s.mu.Lock()
	var left []string
	for _, p := range s.ports {
		left = append(left, p.DeviceID+"/"+p.VethName)
	}
	s.mu.Unlock()
	slices.Sort(left)
	if want := []string{"c1/eth1", "c2/eth0", "c4/eth0"}; !slices.Equal(left, want) {
		t.Fatalf("after GC ports %v, want %v", left, want)
	}
}

func TestDelUnknownProject(t *testing.T) {
	s := newStub(t)
	conf := bytes.Replace(stubConf(s.srv.URL, "1.0.0", ""), []byte(`"p1"`), []byte(`"gone"`), 1)
	if o := invoke(t, call{cmd: "DEL", cid: "c1", ifname: "eth0", conf: conf}); o.exit != 0 {
		t.Fatalf("DEL in a deleted project: %s", o.stdout)
	}
}

func TestAddReplacesStalePort(t *testing.T) {
	s := newStub(t)
	c := call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: stubConf(s.srv.URL, "1.0.0", "")}
	for i := range 2 {
		if o := invoke(t, c); o.exit != 0 {
			t.Fatalf("ADD #%d: %s", i+1, o.stdout)
		}
	}
	if len(s.ports) != 1 {
		t.Fatalf("%d ports", len(s.ports))
	}
}

func TestBadInput(t *testing.T) {
	s := newStub(t)
	conf := stubConf(s.srv.URL, "1.0.0", "")
	tests := []struct {
		name string
		c    call
		code uint
	}{
		{"bad CNI_ARGS", call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", args: "garbage", conf: conf}, types.ErrInvalidEnvironmentVariables},
		{"bad ifname", call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "a/b", conf: conf}, types.ErrInvalidEnvironmentVariables},
		{"bad container id", call{cmd: "ADD", cid: "c 1", netns: "/x", ifname: "eth0", conf: conf}, types.ErrInvalidEnvironmentVariables},
		{"missing subnet", call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: bytes.Replace(conf, []byte(`"subnet":"s1",`), nil, 1)}, types.ErrInvalidNetworkConfig},
		{"unknown subnet", call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: bytes.Replace(conf, []byte(`"p1"`), []byte(`"p9"`), 1)}, types.ErrInvalidNetworkConfig},
		{"chained after another plugin", call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: bytes.Replace(conf, []byte(`"hostId"`), []byte(`"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]},"hostId"`), 1)}, types.ErrInvalidNetworkConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if e := invoke(t, tt.c).cniErr(t); e.Code != tt.code {
				t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, tt.code)
			}
			if len(s.ports) != 0 {
				t.Fatalf("rejected ADD left ports")
			}
		})
	}
}

func TestCheck(t *testing.T) {
	testutil.RequireRoot(t)
	s := newStub(t)
	n := testutil.NewNetNS(t)
	conf := stubConf(s.srv.URL, "1.0.0", "")
	c := call{cmd: "ADD", cid: "c1", netns: n.Path(), ifname: "eth0", conf: conf}
	o := invoke(t, c)
	if o.exit != 0 {
		t.Fatalf("ADD: %s", o.stdout)
	}
	// Play the agent: an interface with the port's MAC and address.
	setLink := func(mac string) {
		err := n.Do(func(ns.NetNS) error {
			if l, err := netlink.LinkByName("eth0"); err == nil {
				_ = netlink.LinkDel(l)
			}
			hw, _ := net.ParseMAC(mac)
			l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: hw}, PeerName: "kcnipeer"}
			if err := netlink.LinkAdd(l); err != nil {
				return err
			}
			a, _ := netlink.ParseAddr("10.77.0.2/24")
			return netlink.AddrAdd(l, a)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	withPrev := bytes.Replace(conf, []byte(`"hostId"`), []byte(`"prevResult":`+string(o.stdout)+`,"hostId"`), 1)
	chk := call{cmd: "CHECK", cid: "c1", netns: n.Path(), ifname: "eth0", conf: withPrev}
	setLink("02:00:00:00:00:01")
	if o := invoke(t, chk); o.exit != 0 {
		t.Fatalf("CHECK of a good attachment: %s", o.stdout)
	}
	setLink("02:00:00:00:00:99")
	if e := invoke(t, chk).cniErr(t); !strings.Contains(e.Msg, "MAC") {
		t.Fatalf("CHECK with a wrong MAC: %s", e.Msg)
	}
	setLink("02:00:00:00:00:01")
	s.setStatus(portID(mustConf(t, conf), "c1", "eth0"), controllerapi.StatusDown)
	if e := invoke(t, chk).cniErr(t); !strings.Contains(e.Msg, "DOWN") {
		t.Fatalf("CHECK of a DOWN port: %s", e.Msg)
	}
	d := c
	d.cmd = "DEL"
	if o := invoke(t, d); o.exit != 0 {
		t.Fatalf("DEL: %s", o.stdout)
	}
	if e := invoke(t, chk).cniErr(t); e.Code != types.ErrUnknownContainer {
		t.Fatalf("CHECK after DEL: code %d %s", e.Code, e.Msg)
	}
}

func mustConf(t testing.TB, b []byte) *NetConf {
	c, err := parseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAddRetriesTransientErrors: ADD retries what a restarting controller
// answers (5xx, a dropped connection) within the retry budget, adopts the
// port of a create whose answer was lost, and takes a 4xx as final.
func TestAddRetriesTransientErrors(t *testing.T) {
	tests := []struct {
		name        string
		failFirst   int // requests answered with status before serving
		status      int
		loseCreates int
		retry       string
		wantCode    uint // 0: success
		wantPosts   int  // 0: any
	}{
		{"503 then served", 3, 503, 0, "", 0, 0},
		{"500 then served", 2, 500, 0, "", 0, 0},
		{"lost create adopted", 0, 0, 1, "", 0, 2},
		{"budget spent", 1 << 30, 503, 0, "300ms", types.ErrTryAgainLater, 0},
		{"no retry with budget 0", 1 << 30, 502, 0, "0s", types.ErrTryAgainLater, 1},
		{"4xx is final", 1 << 30, 403, 0, "", types.ErrInvalidNetworkConfig, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStub(t)
			s.loseCreates = tt.loseCreates
			var mu sync.Mutex
			failed := 0
			s.fail = func(*http.Request) int {
				mu.Lock()
				defer mu.Unlock()
				if failed < tt.failFirst {
					failed++
					return tt.status
				}
				return 0
			}
			extra := ""
			if tt.retry != "" {
				extra = `,"timeouts":{"retry":"` + tt.retry + `"}`
			}
			o := invoke(t, call{cmd: "ADD", cid: "c1", netns: "/x", ifname: "eth0", conf: stubConf(s.srv.URL, "1.1.0", extra)})
			s.mu.Lock()
			n := len(s.ports)
			s.mu.Unlock()
			if tt.wantCode == 0 {
				if o.exit != 0 {
					t.Fatalf("ADD: %s (requests %v)", o.stdout, s.requests())
				}
				if n != 1 {
					t.Fatalf("%d ports after ADD, want 1", n)
				}
			} else {
				if e := o.cniErr(t); e.Code != tt.wantCode {
					t.Fatalf("code %d (%s), want %d", e.Code, e.Msg, tt.wantCode)
				}
				if n != 0 {
					t.Fatalf("failed ADD left %d ports", n)
				}
			}
			posts := 0
			for _, r := range s.requests() {
				if r == "POST /project/p1/ports" {
					posts++
				}
				if strings.HasPrefix(r, "DELETE") && tt.wantCode == 0 {
					t.Errorf("successful ADD deleted a port: %v", s.requests())
				}
			}
			if tt.wantPosts != 0 && posts != tt.wantPosts {
				t.Fatalf("%d POSTs, want %d: %v", posts, tt.wantPosts, s.requests())
			}
		})
	}
}
