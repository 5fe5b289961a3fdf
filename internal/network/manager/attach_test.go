package manager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

func links(t *testing.T, n ns.NetNS) []string {
	t.Helper()
	var out []string
	err := n.Do(func(ns.NetNS) error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			out = append(out, l.Attrs().Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Two pods on one bridge network reach each other and the gateway over TCP;
// after Detach no port or reservation is left.
func TestAttachTwoPodsReachEachOther(t *testing.T) {
	e := newEnv(t)
	nw := e.bridgeNet("knmnet", "eth0", true)
	m := e.manager([]netconf.Network{nw}, 20*time.Second)
	ctx := t.Context()
	p1, n1 := newPod(t)
	p2, n2 := newPod(t)
	for _, p := range []*pod.Pod{p1, p2} {
		raw, err := m.Attach(ctx, p)
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		p.Networks = raw
	}
	ip1, gw := podIP(t, p1.Networks)
	ip2, _ := podIP(t, p2.Networks)
	if ip1.Equal(ip2) || gw == nil {
		t.Fatalf("ips %s %s gw %s", ip1, ip2, gw)
	}
	for _, n := range []ns.NetNS{n1, n2} {
		_ = n.Do(func(ns.NetNS) error {
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			return err
		})
	}
	listen(t, n2, ":7001")
	listen(t, n1, ":7001")
	if err := dial(ctx, n1, net.JoinHostPort(ip2.String(), "7001")); err != nil {
		t.Fatalf("pod1 -> pod2: %v", err)
	}
	if err := dial(ctx, n2, net.JoinHostPort(ip1.String(), "7001")); err != nil {
		t.Fatalf("pod2 -> pod1: %v", err)
	}
	// The gateway is the host's bridge address: a host listener on it.
	hl, err := net.Listen("tcp", net.JoinHostPort(gw.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	go func() {
		for {
			c, err := hl.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	if err := dial(ctx, n1, hl.Addr().String()); err != nil {
		t.Fatalf("pod1 -> gateway: %v", err)
	}
	br := bridgeOf(t, nw)
	if c := bridgePorts(t, br); c != 2 {
		t.Fatalf("bridge %s has %d ports, want 2", br, c)
	}
	if r := e.reservations("knmnet"); len(r) != 2 {
		t.Fatalf("reservations while attached: %v, want 2", r)
	}
	for _, p := range []*pod.Pod{p1, p2} {
		if err := m.Detach(ctx, p); err != nil {
			t.Fatalf("detach: %v", err)
		}
		// Idempotent.
		if err := m.Detach(ctx, p); err != nil {
			t.Fatalf("second detach: %v", err)
		}
	}
	if c := bridgePorts(t, br); c != 0 {
		t.Errorf("bridge %s keeps %d ports after detach", br, c)
	}
	if r := e.reservations("knmnet"); len(r) != 0 {
		t.Errorf("reservations left: %v", r)
	}
	if l := links(t, n1); len(l) != 1 {
		t.Errorf("pod1 links after detach: %v", l)
	}
}

func bridgeOf(t *testing.T, n netconf.Network) string {
	t.Helper()
	s := string(n.Config)
	i := strings.Index(s, `"bridge":"`)
	if i < 0 {
		t.Fatalf("no bridge in %s", s)
	}
	s = s[i+len(`"bridge":"`):]
	return s[:strings.IndexByte(s, '"')]
}

// A pod on two networks gets one interface per template; colliding templates
// are refused before any plugin runs.
func TestAttachTwoNetworksTemplates(t *testing.T) {
	e := newEnv(t)
	a := e.bridgeNet("knma", "eth{{.Index}}", false)
	b := e.bridgeNet("knmb", "eth{{.Index}}", false)
	clash := e.bridgeNet("knmc", "eth0", false)
	m := e.manager([]netconf.Network{a, b, clash}, 20*time.Second)
	ctx := t.Context()

	p, n := newPod(t, "knma", "knmb")
	raw, err := m.Attach(ctx, p)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	p.Networks = raw
	atts, err := manager.DecodeAttachments(raw)
	if err != nil || len(atts) != 2 || atts[0].Interface != "eth0" || atts[1].Interface != "eth1" {
		t.Fatalf("attachments %+v %v", atts, err)
	}
	got := strings.Join(links(t, n), ",")
	for _, want := range []string{"eth0", "eth1"} {
		if !strings.Contains(got, want) {
			t.Errorf("pod links %s lack %s", got, want)
		}
	}
	if err := m.Detach(ctx, p); err != nil {
		t.Fatal(err)
	}

	p2, n2 := newPod(t, "knma", "knmc")
	_, err = m.Attach(ctx, p2)
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("colliding templates: %v, want Conflict", err)
	}
	if l := links(t, n2); len(l) != 1 {
		t.Errorf("links left after refused attach: %v", l)
	}
}

// A failing plugin fails the attach with a clear message within the limit
// and leaves nothing behind, including what earlier networks added.
func TestAttachPluginFailures(t *testing.T) {
	cases := []struct {
		name, add string
		want      string
		max       time.Duration
	}{
		{"exit1", `echo "bridge exploded" >&2; exit 1`, "add exited with 1: bridge exploded", 5 * time.Second},
		{"cnierror", `echo '{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"no type"}'; exit 1`, "bad config: no type", 5 * time.Second},
		{"garbage", `echo 'this is not json'`, "no valid result", 5 * time.Second},
		{"hang", `echo $$ > "$PIDFILE"; exec sleep 60`, "did not finish within 2s", 6 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			good := e.bridgeNet("knmgood", "eth0", false)
			bad := good
			bad.Name = "knmbad"
			bad.Interface, _ = netconf.CompileIface("eth1")
			pidfile := filepath.Join(t.TempDir(), "pid")
			e.caller.Env = append(e.caller.Env, "PIDFILE="+pidfile)
			e.caller.Dirs["knmbad"] = e.scriptDir(c.add, "exit 0")
			m := e.manager([]netconf.Network{good, bad}, 2*time.Second)
			p, n := newPod(t, "knmgood", "knmbad")
			start := time.Now()
			_, err := m.Attach(t.Context(), p)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"knmbad"`) {
				t.Fatalf("error %v, want one naming knmbad with %q", err, c.want)
			}
			if took > c.max {
				t.Errorf("attach took %s, limit %s", took, c.max)
			}
			if l := links(t, n); len(l) != 1 {
				t.Errorf("links left in pod: %v", l)
			}
			if c := bridgePorts(t, bridgeOf(t, good)); c != 0 {
				t.Errorf("%d bridge ports left", c)
			}
			if r := e.reservations("knmgood"); len(r) != 0 {
				t.Errorf("reservations left: %v", r)
			}
			if b, err := os.ReadFile(pidfile); err == nil {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
					t.Errorf("hung plugin %d still runs", pid)
				}
			}
		})
	}
}

// A failed network refuses attaches at once with its reason, and accepts
// them again once it runs.
func TestAttachFailedNetwork(t *testing.T) {
	e := newEnv(t)
	nw := e.bridgeNet("knmf", "eth0", true)
	m := e.manager([]netconf.Network{nw}, 10*time.Second)
	m.SetState("knmf", manager.Failed, "main executable exited: status 1")
	p, _ := newPod(t)
	start := time.Now()
	_, err := m.Attach(t.Context(), p)
	if !errors.Is(err, kerrors.Unavailable) || !strings.Contains(err.Error(), "exited: status 1") || time.Since(start) > time.Second {
		t.Fatalf("attach on failed network: %v", err)
	}
	if ls := m.List(t.Context()); ls[0].State != manager.Failed || ls[0].Error == "" {
		t.Fatalf("list %+v", ls)
	}
	m.SetState("knmf", manager.Running, "")
	raw, err := m.Attach(t.Context(), p)
	if err != nil {
		t.Fatalf("attach after recovery: %v", err)
	}
	p.Networks = raw
	if ls := m.List(t.Context()); ls[0].State != manager.Running || ls[0].Restarts != 1 {
		t.Fatalf("list %+v", ls)
	}
	if err := m.Detach(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

// Host and none pods are not touched; a del that keeps failing is reported
// after the bounded retries instead of blocking.
func TestDetachReportsFailingDel(t *testing.T) {
	e := newEnv(t)
	nw := e.bridgeNet("knmd", "eth0", true)
	e.caller.Dirs["knmd"] = e.scriptDir(`echo '{"cniVersion":"1.0.0","ips":[{"address":"10.177.1.2/24"}]}'`, `echo stuck >&2; exit 3`)
	m, err := manager.New(manager.Options{Networks: []netconf.Network{nw}, Caller: e.caller, DelAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, special := range []string{"host", "none"} {
		raw, err := m.Attach(t.Context(), &pod.Pod{UUID: "x", Spec: pod.Spec{Networks: []string{special}}})
		if err != nil || raw != nil {
			t.Fatalf("%s: %s %v", special, raw, err)
		}
	}
	p, _ := newPod(t)
	raw, err := m.Attach(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	p.Networks = raw
	err = m.Detach(t.Context(), p)
	if err == nil || !strings.Contains(err.Error(), "del failed 2 times") || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("detach: %v", err)
	}
}

// Many pods attach concurrently: all get unique addresses, reach the first
// pod, and leave nothing after detach.
func TestAttachConcurrent(t *testing.T) {
	const pods = 50
	e := newEnv(t)
	nw := e.bridgeNet("knmcc", "eth0", true)
	m := e.manager([]netconf.Network{nw}, 30*time.Second)
	ctx := t.Context()
	ps := make([]*pod.Pod, pods)
	nss := make([]ns.NetNS, pods)
	for i := range ps {
		ps[i], nss[i] = newPod(t)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, pods)
	for i := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw, err := m.Attach(ctx, ps[i])
			ps[i].Networks, errs[i] = raw, err
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent attaches: %s", pods, time.Since(start))
	seen := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		ip, _ := podIP(t, ps[i].Networks)
		if seen[ip.String()] {
			t.Fatalf("duplicate IP %s", ip)
		}
		seen[ip.String()] = true
	}
	ip0, _ := podIP(t, ps[0].Networks)
	listen(t, nss[0], ":7002")
	for i := 1; i < pods; i++ {
		if err := dial(ctx, nss[i], net.JoinHostPort(ip0.String(), "7002")); err != nil {
			t.Fatalf("pod %d -> pod 0: %v", i, err)
		}
	}
	start = time.Now()
	for i := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Detach(context.Background(), ps[i])
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent detaches: %s", pods, time.Since(start))
	for i, err := range errs {
		if err != nil {
			t.Errorf("detach %d: %v", i, err)
		}
	}
	if c := bridgePorts(t, bridgeOf(t, nw)); c != 0 {
		t.Errorf("%d bridge ports left", c)
	}
	if r := e.reservations("knmcc"); len(r) != 0 {
		t.Errorf("%d reservations left", len(r))
	}
}

// DNS from the results fills <pod dir>/resolv.conf, merged in order.
func TestAttachWritesResolvConf(t *testing.T) {
	e := newEnv(t)
	a := e.bridgeNet("knmdns1", "eth0", true)
	b := e.bridgeNet("knmdns2", "eth1", true)
	e.caller.Dirs["knmdns1"] = e.scriptDir(`echo '{"cniVersion":"1.0.0","ips":[{"address":"10.177.1.2/24"}],"dns":{"nameservers":["10.177.1.1"],"search":["a.test"]}}'`, "exit 0")
	e.caller.Dirs["knmdns2"] = e.scriptDir(`echo '{"cniVersion":"1.0.0","ips":[{"address":"10.177.2.2/24"}],"dns":{"nameservers":["10.177.2.1","10.177.1.1"],"domain":"b.test","options":["ndots:2"]}}'`, "exit 0")
	m := e.manager([]netconf.Network{a, b}, 5*time.Second)
	dir := t.TempDir()
	p := &pod.Pod{UUID: "0b7e3d9c-0000-4000-8000-000000000001", NetNS: filepath.Join(dir, "netns")}
	if _, err := m.Attach(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	want := "nameserver 10.177.1.1\nnameserver 10.177.2.1\nsearch a.test b.test\noptions ndots:2\n"
	if string(got) != want {
		t.Fatalf("resolv.conf %q, want %q", got, want)
	}
}
