package cniconformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// Run runs the whole conformance suite for p, one sub-test per cniVersion.
func Run(t *testing.T, p Plugin) {
	versions := p.Versions
	if len(versions) == 0 {
		versions = AllVersions
	}
	for _, v := range versions {
		t.Run("v"+v, func(t *testing.T) {
			if p.Parallel && !p.HostNetNS {
				t.Parallel()
			}
			// Version-independent input handling runs for the oldest and
			// newest version only, to keep the suite fast.
			edge := v == versions[0] || v == versions[len(versions)-1]
			checks := []struct {
				name string
				fn   func(*testing.T, *Env)
				all  bool
			}{
				{"version", checkVersion, true},
				{"lifecycle", checkLifecycle, true},
				{"del-gone-netns", checkDelGoneNetNS, true},
				{"del-unknown", checkDelUnknown, false},
				{"concurrent-add", checkConcurrent, true},
				{"unknown-args", checkUnknownArgs, false},
				{"invalid-config", checkInvalid, false},
				{"gc", checkGC, true},
				{"status", checkStatus, true},
			}
			if p.TransientHostState && p.idle == nil {
				// The state with no attachment at all, once, before any.
				st := NewEnv(t, &p, v).state(nil)
				p.idle = &st
			}
			for _, c := range checks {
				if !c.all && !edge {
					continue
				}
				t.Run(c.name, func(t *testing.T) { c.fn(t, NewEnv(t, &p, v)) })
			}
		})
	}
}

func atLeast(v, min string) bool {
	ok, err := version.GreaterThanOrEqualTo(v, min)
	return err == nil && ok
}

// state is everything an ADD→DEL cycle must restore.
type state struct{ host, ext []string }

func (e *Env) state(markers []string) state {
	h := Snapshot(e.t, e.HostPath())
	if e.Host == nil {
		h = Filter(h, append(slices.Clone(e.P.HostMarkers), markers...))
	}
	return state{host: h, ext: e.External()}
}

// requireSame compares the state now with before; with Plugin.Settle it
// re-takes the state until they match or Settle passes (asynchronous
// datapaths tear down after DEL returns).
func (e *Env) requireSame(what string, before state, markers []string) {
	e.t.Helper()
	after := e.state(markers)
	for deadline := time.Now().Add(e.P.Settle); time.Now().Before(deadline); {
		if Diff(before.host, after.host) == "" && Diff(before.ext, after.ext) == "" {
			break
		}
		time.Sleep(50 * time.Millisecond)
		after = e.state(markers)
	}
	if e.P.Tolerate != nil {
		check := e.t.Name()
		if i := strings.LastIndex(check, "/"); i >= 0 {
			check = check[i+1:]
		}
		drop := func(l string) bool {
			if e.P.Tolerate(check, l) {
				e.t.Logf("%s: tolerated known deviation: %s", what, l)
				return true
			}
			return false
		}
		after.host = slices.DeleteFunc(slices.Clone(after.host), func(l string) bool {
			return !slices.Contains(before.host, l) && drop(l)
		})
	}
	if d := Diff(before.host, after.host); d != "" {
		e.t.Errorf("%s: host netns changed:\n%s", what, d)
	}
	if d := Diff(before.ext, after.ext); d != "" {
		e.t.Errorf("%s: external state changed:\n%s", what, d)
	}
}

// baseline runs the warm-up and returns its markers and the state later
// cycles must restore: taken after the warm-up, or before it when the
// plugin's per-network host state lives only while attachments exist.
func (e *Env) baseline() ([]string, state) {
	if e.P.TransientHostState {
		return e.warmUp(), *e.P.idle
	}
	m := e.warmUp()
	return m, e.state(m)
}

// warmUp runs one ADD→DEL so that per-network state (a bridge, an nft
// table) exists before the measured cycle; it returns the markers (addresses,
// MAC) that the attachment used.
func (e *Env) warmUp() []string {
	e.t.Helper()
	c := e.NewContainer()
	res, err := e.Add(c)
	if err != nil {
		e.t.Fatalf("warm-up ADD: %v", err)
	}
	m := markers(e.t, res)
	if err := e.Del(c); err != nil {
		e.t.Fatalf("warm-up DEL: %v", err)
	}
	return m
}

func markers(t testing.TB, res types.Result) []string {
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatalf("convert result: %v", err)
	}
	var m []string
	for _, ip := range r.IPs {
		m = append(m, " "+ip.Address.IP.String()+"/", " "+ip.Address.IP.String()+" ")
	}
	for _, i := range r.Interfaces {
		if i.Sandbox != "" && i.Mac != "" {
			m = append(m, i.Mac)
		}
	}
	return m
}

func checkVersion(t *testing.T, e *Env) {
	var info version.PluginInfo
	err := e.inHost(func() error {
		var err error
		info, err = e.CNI.GetVersionInfo(t.Context(), e.P.Type)
		return err
	})
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	if !slices.Contains(info.SupportedVersions(), e.Version) {
		t.Fatalf("VERSION lists %v, lacks %s", info.SupportedVersions(), e.Version)
	}
	r := e.Exec("VERSION", nil, []byte(`{"cniVersion":"`+e.Version+`"}`))
	var out struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if r.ExitCode != 0 || json.Unmarshal(r.Stdout, &out) != nil || out.CNIVersion == "" {
		t.Fatalf("raw VERSION: exit %d, stdout %s", r.ExitCode, r.Stdout)
	}
}

// CheckResult verifies res against the schema of cniVersion v and, when
// netns is given, against the interface really present there.
func CheckResult(t testing.TB, v string, res types.Result, c *Container) {
	t.Helper()
	if res.Version() != v {
		t.Fatalf("result version %s, want %s", res.Version(), v)
	}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["cniVersion"] != v {
		t.Errorf("result cniVersion %v, want %s: %s", m["cniVersion"], v, raw)
	}
	if !atLeast(v, "0.3.0") {
		ip4, _ := m["ip4"].(map[string]any)
		if ip4 == nil || ip4["ip"] == nil {
			t.Fatalf("%s result lacks ip4.ip: %s", v, raw)
		}
		if _, ok := m["interfaces"]; ok {
			t.Errorf("%s result has interfaces: %s", v, raw)
		}
	} else {
		ifs, _ := m["interfaces"].([]any)
		ips, _ := m["ips"].([]any)
		if len(ips) == 0 {
			t.Fatalf("%s result has no ips: %s", v, raw)
		}
		for _, x := range ips {
			ip := x.(map[string]any)
			if _, ok := ip["version"]; ok != !atLeast(v, "1.0.0") {
				t.Errorf("%s result ip version field present=%v: %s", v, ok, raw)
			}
			if idx, ok := ip["interface"].(float64); ok && (int(idx) < 0 || int(idx) >= len(ifs)) {
				t.Errorf("ip interface index %v out of range: %s", idx, raw)
			}
			if _, _, err := net.ParseCIDR(fmt.Sprint(ip["address"])); err != nil {
				t.Errorf("ip address %v: %v", ip["address"], err)
			}
		}
	}
	r100, err := types100.NewResultFromResult(res)
	if err != nil {
		t.Fatalf("convert to 1.0.0: %v", err)
	}
	if c == nil || c.NetNS == nil || !atLeast(v, "0.3.0") {
		return
	}
	var ifc *types100.Interface
	for _, i := range r100.Interfaces {
		if i.Sandbox == c.NetNS.Path() && i.Name == c.IfName {
			ifc = i
		}
	}
	if ifc == nil {
		t.Fatalf("result has no interface %s with sandbox %s: %s", c.IfName, c.NetNS.Path(), raw)
	}
	err = c.NetNS.Do(func(ns.NetNS) error {
		l, err := net.InterfaceByName(c.IfName)
		if err != nil {
			return err
		}
		if !strings.EqualFold(l.HardwareAddr.String(), ifc.Mac) {
			return fmt.Errorf("%s MAC %s, result says %s", c.IfName, l.HardwareAddr, ifc.Mac)
		}
		addrs, err := l.Addrs()
		if err != nil {
			return err
		}
		for _, ip := range r100.IPs {
			if !slices.ContainsFunc(addrs, func(a net.Addr) bool { return a.String() == ip.Address.String() }) {
				return fmt.Errorf("%s lacks %s (has %v)", c.IfName, ip.Address.String(), addrs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("container netns: %v", err)
	}
}

func checkLifecycle(t *testing.T, e *Env) {
	m, before := e.baseline()
	c := e.NewContainer()
	cBefore := Snapshot(t, c.NetNS.Path())
	res, err := e.Add(c)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	CheckResult(t, e.Version, res, c)
	m = append(m, markers(t, res)...)
	if atLeast(e.Version, "0.4.0") {
		if err := e.Check(c); err != nil {
			t.Errorf("CHECK after ADD: %v", err)
		}
	}
	for i := range 2 {
		if err := e.Del(c); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	e.requireSame("ADD→DEL→DEL", before, m)
	if d := Diff(cBefore, Snapshot(t, c.NetNS.Path())); d != "" {
		t.Errorf("container netns changed:\n%s", d)
	}
	if atLeast(e.Version, "0.4.0") {
		var te *types.Error
		if err := e.Check(c); err == nil {
			t.Errorf("CHECK after DEL succeeded")
		} else if !errors.As(err, &te) {
			t.Errorf("CHECK after DEL: %v is not a CNI error", err)
		}
	}
}

func checkDelGoneNetNS(t *testing.T, e *Env) {
	m, before := e.baseline()
	c := e.NewContainer()
	res, err := e.Add(c)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	m = append(m, markers(t, res)...)
	// The container dies: its netns goes away before DEL.
	e.removeNetNS(t, c)
	for i := range 2 {
		if err := e.Del(c); err != nil {
			t.Fatalf("DEL #%d with empty netns: %v", i+1, err)
		}
	}
	e.requireSame("ADD→netns gone→DEL", before, m)
}

func checkDelUnknown(t *testing.T, e *Env) {
	before := e.state(nil)
	c := e.NewContainer()
	if err := e.Del(c); err != nil {
		t.Fatalf("DEL of a container never added: %v", err)
	}
	c.NetNS = nil
	if err := e.Del(c); err != nil {
		t.Fatalf("DEL of a container never added, empty netns: %v", err)
	}
	e.requireSame("DEL unknown", before, nil)
}

func checkConcurrent(t *testing.T, e *Env) {
	m, before := e.baseline()
	n := e.P.Concurrency
	if n == 0 {
		n = 4
	}
	cs := make([]*Container, n)
	for i := range cs {
		cs[i] = e.NewContainer()
	}
	results := make([]types.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { results[i], errs[i] = e.Add(c) })
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent ADD %d: %v", i, err)
			continue
		}
		CheckResult(t, e.Version, results[i], cs[i])
		r, _ := types100.NewResultFromResult(results[i])
		for _, ip := range r.IPs {
			if j, dup := seen[ip.Address.IP.String()]; dup {
				t.Errorf("containers %d and %d share %s", j, i, ip.Address.IP)
			}
			seen[ip.Address.IP.String()] = i
		}
		m = append(m, markers(t, results[i])...)
	}
	for i, c := range cs {
		wg.Go(func() { errs[i] = e.Del(c) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent DEL %d: %v", i, err)
		}
	}
	e.requireSame("concurrent ADD→DEL", before, m)
}

func checkUnknownArgs(t *testing.T, e *Env) {
	var conf map[string]any
	if err := json.Unmarshal(e.Conf, &conf); err != nil {
		t.Fatal(err)
	}
	extra := map[string]any{"cni": map[string]any{"kurmaUnknownKey": []any{1, "x"}}, "kurma.dev/unknown": true}
	if pl, ok := conf["plugins"].([]any); ok {
		for _, p := range pl {
			p.(map[string]any)["args"] = extra
		}
	} else {
		conf["args"] = extra
	}
	b, _ := json.Marshal(conf)
	list, err := ParseConfList(b)
	if err != nil {
		t.Fatal(err)
	}
	e.List = list
	c := e.NewContainer()
	c.Args = append(c.Args, [2]string{"IgnoreUnknown", "1"}, [2]string{"KURMA_UNKNOWN_ARG", "x"})
	res, err := e.Add(c)
	if err != nil {
		t.Fatalf("ADD with unknown args: %v", err)
	}
	CheckResult(t, e.Version, res, c)
	if err := e.Del(c); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// genericInvalid are configs every plugin rejects.
func genericInvalid(e *Env) []InvalidConfig {
	var conf map[string]any
	_ = json.Unmarshal(e.List.Plugins[0].Bytes, &conf)
	conf["cniVersion"] = "99.0.0"
	future, _ := json.Marshal(conf)
	return []InvalidConfig{
		{"not-json", []byte(`{"cniVersion":"` + e.Version + `",`), types.ErrDecodingFailure},
		{"future-version", future, types.ErrIncompatibleCNIVersion},
	}
}

func checkInvalid(t *testing.T, e *Env) {
	m, before := e.baseline()
	cases := genericInvalid(e)
	if e.P.InvalidConfigs != nil {
		cases = append(cases, e.P.InvalidConfigs(t, e.Version)...)
	}
	// One container for all cases: a rejected ADD must leave it as new.
	c := e.NewContainer()
	for _, ic := range cases {
		t.Run(ic.Name, func(t *testing.T) {
			r := e.Exec("ADD", c, ic.Config)
			if r.ExitCode == 0 {
				t.Fatalf("ADD accepted invalid config: %s", r.Stdout)
			}
			var te types.Error
			var withVer struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err := json.Unmarshal(r.Stdout, &te); err != nil || te.Code == 0 || te.Msg == "" ||
				json.Unmarshal(r.Stdout, &withVer) != nil || (e.P.ErrorsHaveVersion && withVer.CNIVersion == "") {
				t.Fatalf("stdout is not CNI error JSON (%v): %q, stderr %q", err, r.Stdout, r.Stderr)
			}
			if ic.Code != 0 && te.Code != ic.Code {
				t.Errorf("error code %d (%s), want %d", te.Code, te.Msg, ic.Code)
			}
			if links := linkNames(t, c.NetNS); !slices.Equal(links, []string{"lo"}) {
				t.Errorf("rejected ADD left links %v in the container netns", links)
			}
		})
	}
	e.requireSame("rejected ADDs", before, m)
}

// linkNames lists the links in a netns (in-process: cheaper than a
// snapshot).
func linkNames(t testing.TB, n ns.NetNS) []string {
	t.Helper()
	var names []string
	err := n.Do(func(ns.NetNS) error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func checkGC(t *testing.T, e *Env) {
	if !atLeast(e.Version, "1.1.0") {
		t.Skip("GC needs CNI 1.1.0")
	}
	m, before := e.baseline()
	keep, stale := e.NewContainer(), e.NewContainer()
	res, err := e.Add(keep)
	if err != nil {
		t.Fatalf("ADD keep: %v", err)
	}
	m = append(m, markers(t, res)...)
	withKeep := e.External()
	// The stale attachment is unknown to this runtime's cache, as after a
	// crash: only the plugin's own GC can find it.
	other := *e
	other.CNI = newCNI(e.P.Path, t.TempDir())
	res, err = other.Add(stale)
	if err != nil {
		t.Fatalf("ADD stale: %v", err)
	}
	m = append(m, markers(t, res)...)
	if err := e.GC([]*Container{keep}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if err := e.Check(keep); err != nil {
		t.Errorf("CHECK of the valid attachment after GC: %v", err)
	}
	if e.P.GCReleases {
		if d := Diff(withKeep, e.External()); d != "" {
			t.Errorf("GC left stale state or removed valid state:\n%s", d)
		}
	}
	for _, c := range []*Container{keep, stale} {
		if err := e.Del(c); err != nil {
			t.Errorf("DEL: %v", err)
		}
	}
	e.requireSame("GC", before, m)
}

func checkStatus(t *testing.T, e *Env) {
	if !atLeast(e.Version, "1.1.0") {
		t.Skip("STATUS needs CNI 1.1.0")
	}
	if err := e.Status(); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
}
