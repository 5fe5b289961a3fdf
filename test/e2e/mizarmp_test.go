package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/test/cniconformance/mpenv"
)

// TestMizarmpNetworkE2E runs the Kurma network controller and host agent
// (test/cniconformance/mpenv) and kurmad with one pod_networks entry of
// type mizarmp served by bin/images/kurma-netplugin-mizarmp.aci. Two pods
// start on it: each gets the controller's address for its port (UP) in
// `kurma inspect`, one reaches the other's httpd over TCP through the
// agent's VPC bridge, and after `kurma rm` the controller has no port for
// this host and the host has no link the agent made.
//
// The plugin mode is kurmad's: KURMA_NETWORK_MODE from the environment
// (unset: kurmad's default, host mode today). In pod mode NETNS_PATH is
// /run/kurma/netns/<uuid>, a path valid on the host as well, so the same
// checks apply.
func TestMizarmpNetworkE2E(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	b := findBins(t)
	binDir := buildDir(t)
	aci := filepath.Join(binDir, "images", "kurma-netplugin-mizarmp.aci")
	for _, f := range []string{aci, filepath.Join(binDir, "kurma-controller"), filepath.Join(binDir, "kurma-agent")} {
		if !fileExists(f) {
			t.Skipf("%s not built (make build)", f)
		}
	}
	mode := os.Getenv("KURMA_NETWORK_MODE")
	if mode == "" {
		mode = "pod (kurmad's default)"
	}
	t.Logf("network mode: %s", mode)
	src := serveBusybox(t)
	t.Setenv("KURMA_NETWORK_CALL_TIMEOUT", "20s")

	// The control plane, with the agent's links and nft table under a
	// prefix of our own.
	prefix := testutil.UniqueName("kcp")[:5]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	env, err := mpenv.Start(ctx, mpenv.Options{
		ControllerBin: filepath.Join(binDir, "kurma-controller"),
		AgentBin:      filepath.Join(binDir, "kurma-agent"),
		TmpDir:        t.TempDir(),
		Agent:         true,
		HostID:        testutil.UniqueName("kcp-host"),
		LinkPrefix:    prefix,
		NFTTable:      testutil.UniqueName("kcp"),
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("start controller and agent: %v", err)
	}
	t.Cleanup(env.Close)

	netName := testutil.UniqueName("kcpmz")
	entry, err := json.Marshal(map[string]any{
		"name": netName, "aci": "file://" + aci, "default": true, "containerInterface": "eth0",
		"cniVersion": "1.1.0", "type": "mizarmp",
		"mpurl": env.URL, "subnet": env.Subnet, "project": env.Project, "hostId": env.HostID,
	})
	must(t, err)
	d := startDaemon(t, b, "pod_networks: ["+string(entry)+"]\n")
	eventually(t, 30*time.Second, func() error {
		var ls []struct{ Name, State string }
		if err := json.Unmarshal([]byte(d.ok(t, "net", "ls", "--json")), &ls); err != nil {
			return err
		}
		if len(ls) != 1 || ls[0].Name != netName || ls[0].State != "running" {
			return fmt.Errorf("net ls: %+v", ls)
		}
		return nil
	})

	p1, p2 := testutil.UniqueName("kcp"), testutil.UniqueName("kcp")
	d.ok(t, "run", "-d", "--name", p1, src.aci, "sh", "-c", "echo hello-kcp > /tmp/index.html; exec busybox httpd -f -p 8080 -h /tmp")
	t.Cleanup(func() { d.kurma("rm", "-f", p1) })
	d.ok(t, "run", "-d", "--name", p2, src.aci, "sleep", "1000")
	t.Cleanup(func() { d.kurma("rm", "-f", p2) })

	// inspect shows the address the controller gave each pod's port, and
	// the port is UP, bound to this host, for the pod's netns and eth0.
	ports, err := env.Client.ListPorts(ctx, env.Project, controllerapi.PortFilter{HostID: env.HostID})
	must(t, err)
	if len(ports) != 2 {
		t.Fatalf("controller has %d ports for host %s, want 2: %+v", len(ports), env.HostID, ports)
	}
	ips := map[string]string{}
	for _, name := range []string{p1, p2} {
		pd := d.inspect(t, name)
		a := attachments(t, d, name)
		if len(a) != 1 || a[0].Network != netName || a[0].Interface != "eth0" || a[0].Result == nil || len(a[0].Result.IPs) != 1 {
			t.Fatalf("inspect %s networks: %+v", name, a)
		}
		ip := a[0].Result.IPs[0].Address.IP.String()
		ips[name] = ip
		i := slices.IndexFunc(ports, func(p controllerapi.Port) bool {
			return len(p.FixedIPs) == 1 && p.FixedIPs[0].IPAddress == ip
		})
		if i < 0 {
			t.Fatalf("pod %s has %s, which no controller port has: %+v", name, ip, ports)
		}
		p := ports[i]
		if p.Status != controllerapi.StatusUp || p.VethName != "eth0" || !sameNetNS(p.NetworkNS, pd.NetNS) || p.DeviceID != pd.UUID {
			t.Errorf("port of pod %s (uuid %s, netns %s): status %s veth %s netns %s device %s",
				name, pd.UUID, pd.NetNS, p.Status, p.VethName, p.NetworkNS, p.DeviceID)
		}
		if gw := a[0].Result.IPs[0].Gateway; gw == nil || gw.String() != p.FixedIPs[0].GatewayIP {
			t.Errorf("pod %s gateway %v, controller's %s", name, gw, p.FixedIPs[0].GatewayIP)
		}
		links := testutil.Run(t, "nsenter", "--net="+pd.NetNS, "ip", "-o", "addr", "show", "dev", "eth0")
		if !strings.Contains(links, " "+ip+"/") {
			t.Errorf("pod %s eth0 lacks %s:\n%s", name, ip, links)
		}
	}

	// TCP from pod 2's namespace to pod 1's httpd, across the VPC bridge.
	ns2 := d.inspect(t, p2).NetNS
	eventually(t, 10*time.Second, func() error {
		out, err := httpGetIn(ns2, "http://"+ips[p1]+":8080/index.html")
		if err != nil || strings.TrimSpace(out) != "hello-kcp" {
			return fmt.Errorf("GET pod1's httpd from pod2's netns: %q %v", out, err)
		}
		return nil
	})

	// After rm: no port for this host in the controller, and (once the
	// agent has unplugged and the idle VPC's linger has passed) no link
	// with the agent's prefix on the host.
	if !strings.Contains(agentLinks(t, prefix), prefix) {
		t.Fatalf("no link with the agent's prefix %s while pods run", prefix)
	}
	d.ok(t, "rm", "-f", p1, p2)
	left, err := env.Client.ListPorts(ctx, env.Project, controllerapi.PortFilter{HostID: env.HostID})
	must(t, err)
	if len(left) != 0 {
		t.Errorf("controller still has %d ports after rm: %+v", len(left), left)
	}
	eventually(t, 20*time.Second, func() error {
		if l := agentLinks(t, prefix); l != "" {
			return fmt.Errorf("links left on the host:\n%s", l)
		}
		return nil
	})
}

// sameNetNS tells whether two paths reference the same network namespace
// (in pod mode the plugin sees the pod's namespace through kurmad's netns
// directory, not through the pod's own reference).
func sameNetNS(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// agentLinks lists the host's links whose name starts with prefix.
func agentLinks(t *testing.T, prefix string) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	must(t, err)
	var b strings.Builder
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], prefix) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
