package e2e

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/testutil"
)

// knmNet is one test network: a fresh bridge and /24, never kurma0's
// 10.220.0.0/16.
type knmNet struct {
	name, bridge, subnet, iface string
	def                         bool
}

func (n knmNet) entry(aci, ipamDir string) string {
	e := map[string]any{
		"name": n.name, "aci": aci, "default": n.def, "containerInterface": n.iface,
		"cniVersion": "1.0.0", "type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": false,
		"dns": map[string]any{"nameservers": []string{"192.0.2.53"}, "search": []string{n.name + ".test"}},
		"ipam": map[string]any{"type": "host-local", "subnet": n.subnet, "dataDir": ipamDir,
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
	}
	b, _ := json.Marshal(e)
	return string(b)
}

// attachments decodes a pod's Networks.
func attachments(t *testing.T, d *daemon, ref string) []manager.Attachment {
	t.Helper()
	a, err := manager.DecodeAttachments(d.inspect(t, ref).Networks)
	must(t, err)
	return a
}

// TestNetworkE2E runs kurmad with three knm bridge networks served by the
// default plugin image and checks reachability, inspect, interface
// templates, template collisions, `kurma net ls` and that nothing is left.
func TestNetworkE2E(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	binDir := buildDir(t)
	aci := filepath.Join(binDir, "images", "kurma-netplugin.aci")
	if !fileExists(aci) {
		t.Skipf("%s not built (make build)", aci)
	}
	src := serveBusybox(t)
	t.Setenv("KURMA_NETWORK_CALL_TIMEOUT", "10s")

	r := make([]byte, 1)
	_, _ = rand.Read(r)
	nets := []knmNet{
		{name: "knma", iface: "eth{{.Index}}", def: true},
		{name: "knmb", iface: "eth{{.Index}}"},
		{name: "knmc", iface: "eth0"},
	}
	// host-local keeps its store in the plugin's state volume:
	// <kurmad dir>/network/<network>/ipam/<network> on the host.
	ipamDir := netconf.PluginStateDir + "/ipam"
	var entries []string
	for i := range nets {
		nets[i].bridge = testutil.UniqueName("knm")
		nets[i].subnet = fmt.Sprintf("10.178.%d.0/24", (int(r[0])+i)%256)
		entries = append(entries, nets[i].entry("file://"+aci, ipamDir))
		br := nets[i].bridge
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", br).Run() })
	}
	// knmbad's image (busybox) does not declare host privilege: refused.
	bad := knmNet{name: "knmbad", iface: "eth5", bridge: testutil.UniqueName("knm"), subnet: "10.178.255.0/28"}
	entries = append(entries, bad.entry(src.aci, ipamDir))
	hostname, _ := os.Hostname()
	d := startDaemon(t, b, "pod_networks: ["+strings.Join(entries, ", ")+"]\n")
	var mains []int

	t.Run("net-ls", func(t *testing.T) {
		eventually(t, 30*time.Second, func() error {
			var ls []struct{ Name, State string }
			if err := json.Unmarshal([]byte(d.ok(t, "net", "ls", "--json")), &ls); err != nil {
				return err
			}
			if len(ls) != 4 {
				return fmt.Errorf("net ls: %+v", ls)
			}
			for _, n := range ls {
				if want := map[bool]string{true: "failed", false: "running"}[n.Name == "knmbad"]; n.State != want {
					return fmt.Errorf("network %s is %s", n.Name, n.State)
				}
			}
			return nil
		})
		if out := d.ok(t, "net", "ls"); !strings.Contains(out, "knma") || !strings.Contains(out, "true") {
			t.Fatalf("net ls table:\n%s", out)
		}
		// Pod mode: three plugin containers (knmbad's image is refused).
		mains = checkNetPod(t, d, hostname, 3)
	})

	t.Run("two-pods-tcp", func(t *testing.T) {
		p1, p2 := testutil.UniqueName("knm"), testutil.UniqueName("knm")
		d.ok(t, "run", "-d", "--name", p1, src.aci, "sh", "-c", "echo hello-knm > /tmp/index.html; exec busybox httpd -f -p 8080 -h /tmp")
		t.Cleanup(func() { d.kurma("rm", "-f", p1) })
		d.ok(t, "run", "-d", "--name", p2, src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", p2) })
		a1, a2 := attachments(t, d, p1), attachments(t, d, p2)
		// p2's namespace was made after the networking pod started.
		netRefVisible(t, d, d.inspect(t, p2), mains)
		if len(a1) != 1 || a1[0].Network != "knma" || a1[0].Interface != "eth0" || a1[0].Result == nil || len(a1[0].Result.IPs) != 1 {
			t.Fatalf("inspect %s networks: %+v", p1, a1)
		}
		ip1, ip2 := a1[0].Result.IPs[0].Address.IP, a2[0].Result.IPs[0].Address.IP
		gw := a1[0].Result.IPs[0].Gateway
		if ip1.Equal(ip2) || gw == nil {
			t.Fatalf("IPs %s %s gateway %v", ip1, ip2, gw)
		}
		// The busybox image's static wget crashes in getaddrinfo, so the
		// client side runs in pod2's network namespace from this process.
		ns2 := d.inspect(t, p2).NetNS
		eventually(t, 10*time.Second, func() error {
			out, err := httpGetIn(ns2, "http://"+ip1.String()+":8080/index.html")
			if err != nil || strings.TrimSpace(out) != "hello-knm" {
				return fmt.Errorf("GET pod1's httpd from pod2's netns: %q %v", out, err)
			}
			return nil
		})
		// The gateway is the bridge's address on the host.
		l, err := net.Listen("tcp", net.JoinHostPort(gw.String(), "0"))
		must(t, err)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "gw-ok") })}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { srv.Close() })
		if out, err := httpGetIn(ns2, "http://"+l.Addr().String()+"/"); err != nil || out != "gw-ok" {
			t.Fatalf("GET gateway from pod2's netns: %q %v", out, err)
		}
		// DNS from the result reaches the apps' /etc/resolv.conf.
		if out := d.ok(t, "exec", p2, "cat", "/etc/resolv.conf"); !strings.Contains(out, "nameserver 192.0.2.53") || !strings.Contains(out, "search knma.test") {
			t.Errorf("pod resolv.conf:\n%s", out)
		}
		if a2[0].Result.DNS.Nameservers[0] != "192.0.2.53" {
			t.Errorf("inspect DNS %+v", a2[0].Result.DNS)
		}
		pods1 := d.inspect(t, p1)
		d.ok(t, "rm", "-f", p1, p2)
		if _, err := os.Stat(pods1.NetNS); err == nil {
			t.Errorf("netns reference %s left", pods1.NetNS)
		}
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left on %s", ports, nets[0].bridge)
		}
	})

	t.Run("failed-network", func(t *testing.T) {
		if out := d.ok(t, "net", "ls"); !strings.Contains(out, "failed") || !strings.Contains(out, "does not declare") {
			t.Fatalf("net ls:\n%s", out)
		}
		p := testutil.UniqueName("knm")
		_, stderr, code := d.kurma("run", "-d", "--name", p, "--net", "knma,knmbad", src.aci, "sleep", "1000")
		if code == 0 || !strings.Contains(stderr, `network "knmbad" has failed`) {
			d.kurma("rm", "-f", p)
			t.Fatalf("pod on failed network: exit %d stderr %q", code, stderr)
		}
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left on %s after the failed start", ports, nets[0].bridge)
		}
	})

	t.Run("concurrent-pods", func(t *testing.T) {
		const n = 50
		names := make([]string, n)
		errs := make(chan error, n)
		start := time.Now()
		for i := range names {
			names[i] = testutil.UniqueName("knm")
			t.Cleanup(func() { d.kurma("rm", "-f", names[i]) })
			go func() {
				_, stderr, code := d.kurma("run", "-d", "--name", names[i], src.aci, "sh", "-c",
					"echo "+names[i]+" > /tmp/index.html; exec busybox httpd -f -p 8080 -h /tmp")
				if code != 0 {
					errs <- fmt.Errorf("run %s: %d %s", names[i], code, stderr)
					return
				}
				errs <- nil
			}()
		}
		for range names {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%d pods started concurrently in %s", n, time.Since(start))
		seen := map[string]bool{}
		var nss []string
		for _, name := range names {
			a := attachments(t, d, name)
			ip := a[0].Result.IPs[0].Address.IP.String()
			if seen[ip] {
				t.Fatalf("duplicate IP %s", ip)
			}
			seen[ip] = true
			nss = append(nss, d.inspect(t, name).NetNS)
		}
		// The reservations live in the plugin's state volume on the host.
		if ents, err := os.ReadDir(filepath.Join(d.dir, "network", "knma", "ipam", "knma")); err != nil || len(ents) < n {
			t.Errorf("host-local store in the state volume: %d entries, %v", len(ents), err)
		}
		if ports := bridgePortCount(t, nets[0].bridge); ports != n {
			t.Errorf("bridge has %d ports, want %d", ports, n)
		}
		// From the first pod's namespace, every pod's httpd answers with
		// its own name over TCP.
		for i, name := range names {
			ip := attachments(t, d, name)[0].Result.IPs[0].Address.IP.String()
			eventually(t, 10*time.Second, func() error {
				out, err := httpGetIn(nss[0], "http://"+ip+":8080/index.html")
				if err != nil || strings.TrimSpace(out) != name {
					return fmt.Errorf("pod %d (%s) from pod 0: %q %v", i, ip, out, err)
				}
				return nil
			})
		}
		d.ok(t, append([]string{"rm", "-f"}, names...)...)
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left after rm", ports)
		}
		ents, _ := os.ReadDir(filepath.Join(d.dir, "network", "knma", "ipam", "knma"))
		for _, e := range ents {
			if net.ParseIP(e.Name()) != nil {
				t.Errorf("IP reservation %s left after rm", e.Name())
			}
		}
	})

	t.Run("plugin-main-dies", func(t *testing.T) {
		// Kill knma's main (the first app): knma fails, the pod is
		// replaced after a backoff, and pods attach again.
		mains := pluginMains(t, d)
		var knma int
		for _, pid := range mains {
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil && strings.Contains(string(env), "AC_APP_NAME=knma\x00") {
				knma = pid
			}
		}
		if knma == 0 {
			t.Fatalf("no main of knma among %v", mains)
		}
		// A pod attached before the restart: its netns reference was bound
		// before the new networking pod started and must be there too.
		old := testutil.UniqueName("knm")
		d.ok(t, "run", "-d", "--name", old, src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", old) })
		killPluginMain(t, d, "knma", knma)
		mains = checkNetPod(t, d, hostname, 3)
		netRefVisible(t, d, d.inspect(t, old), mains)
		d.ok(t, "rm", "-f", old)
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left after removing a pod attached before the restart", ports)
		}
		p := testutil.UniqueName("knm")
		d.ok(t, "run", "-d", "--name", p, src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", p) })
		if a := attachments(t, d, p); len(a) != 1 || a[0].Result == nil {
			t.Fatalf("attachments after recovery %+v", a)
		}
		netRefVisible(t, d, d.inspect(t, p), mains)
		d.ok(t, "rm", "-f", p)
	})

	t.Run("two-networks", func(t *testing.T) {
		p := testutil.UniqueName("knm")
		d.ok(t, "run", "-d", "--name", p, "--net", "knma,knmb", src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", p) })
		a := attachments(t, d, p)
		if len(a) != 2 || a[0].Interface != "eth0" || a[1].Interface != "eth1" {
			t.Fatalf("attachments %+v", a)
		}
		links := testutil.Run(t, "nsenter", "--net="+d.inspect(t, p).NetNS, "ip", "-o", "link")
		if !strings.Contains(links, " eth0@") || !strings.Contains(links, " eth1@") {
			t.Fatalf("pod links:\n%s", links)
		}
	})

	t.Run("colliding-template", func(t *testing.T) {
		p := testutil.UniqueName("knm")
		_, stderr, code := d.kurma("run", "-d", "--name", p, "--net", "knma,knmc", src.aci, "sleep", "1000")
		if code == 0 || !strings.Contains(stderr, "already used") {
			d.kurma("rm", "-f", p)
			t.Fatalf("colliding templates: exit %d stderr %q", code, stderr)
		}
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left on %s", ports, nets[0].bridge)
		}
	})

	// Last: it restarts the daemon. A pod attached before a kill -9 keeps
	// its attachment record, and removing it after the restart runs del
	// (no port or reservation left). The old plugin mains die with kurmad
	// (Pdeathsig); the harness fails on processes left under its folder.
	t.Run("daemon-restart", func(t *testing.T) {
		p := testutil.UniqueName("knm")
		d.ok(t, "run", "-d", "--name", p, src.aci, "sleep", "1000")
		t.Cleanup(func() { d.kurma("rm", "-f", p) })
		before := attachments(t, d, p)
		np := d.inspect(t, manager.DefaultNetPodName)
		d.kill9()
		d.start()
		// The networking pod is adopted, not duplicated or replaced.
		eventually(t, 20*time.Second, func() error {
			if n := netList(t, d)["knma"]; n.State != "running" {
				return fmt.Errorf("knma %+v", n)
			}
			return nil
		})
		if np2 := d.inspect(t, manager.DefaultNetPodName); np2.UUID != np.UUID || np2.StagerPID != np.StagerPID {
			t.Errorf("networking pod after restart %s/%d, before %s/%d", np2.UUID, np2.StagerPID, np.UUID, np.StagerPID)
		}
		after := attachments(t, d, p)
		if len(after) != 1 || !after[0].Result.IPs[0].Address.IP.Equal(before[0].Result.IPs[0].Address.IP) {
			t.Fatalf("attachments after restart %+v, before %+v", after, before)
		}
		d.ok(t, "rm", "-f", p)
		if ports := bridgePortCount(t, nets[0].bridge); ports != 0 {
			t.Errorf("%d ports left after rm following a restart", ports)
		}
		ents, _ := os.ReadDir(filepath.Join(d.dir, "network", "knma", "ipam", "knma"))
		for _, e := range ents {
			if net.ParseIP(e.Name()) != nil {
				t.Errorf("IP reservation %s left", e.Name())
			}
		}
	})
}

// httpGetIn fetches url from inside the network namespace at nsPath.
func httpGetIn(nsPath, url string) (string, error) {
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		return "", err
	}
	defer netns.Close()
	var body []byte
	err = netns.Do(func(ns.NetNS) error {
		// A fresh transport: its sockets are made on this (namespaced) thread.
		c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		return err
	})
	return string(body), err
}

// bridgePortCount counts the interfaces enslaved to br.
func bridgePortCount(t *testing.T, br string) int {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show", "master", br).Output()
	if err != nil {
		return 0
	}
	return strings.Count(string(out), "\n")
}
