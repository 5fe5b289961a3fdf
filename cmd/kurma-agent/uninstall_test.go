package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/agent/nettest"
	"kurma.dev/kurma/internal/testutil"
)

// TestUninstall fills a namespace with what an agent leaves (and with
// what is not the agent's), runs the uninstall there twice and checks that
// exactly the agent's part is gone.
func TestUninstall(t *testing.T) {
	testutil.RequireRoot(t)
	nsPath := nettest.NewNS(t, testutil.UniqueName("kaun"))
	ip := func(args ...string) { nettest.IP(t, nsPath, args...) }
	nft := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"netns", "exec", nettest.Name(nsPath), "nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	ip("link", "set", "lo", "up")
	ip("link", "add", "kap1", "type", "veth", "peer", "name", "kap1c")
	ip("link", "set", "kap1", "alias", "kurma-agent:port:p1")
	ip("link", "add", "kab5", "type", "bridge")
	ip("link", "set", "kab5", "alias", "kurma-agent:vpc:5")
	ip("link", "add", "other0", "type", "veth", "peer", "name", "other1")
	ip("link", "set", "other0", "alias", "someone-else")
	ip("route", "add", "10.96.0.0/12", "dev", "lo", "proto", "76")
	ip("route", "add", "10.1.0.0/16", "dev", "lo", "proto", "static")
	nft("add", "table", "inet", "kurma-agent")
	nft("add", "table", "bridge", "kurma-agent")
	nft("add", "table", "inet", "other")

	dir := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mk("conf/10-kurma.conflist")
	mk("conf/20-other.conflist")
	mk("bin/kurma-k8s")
	mk("bin/loopback")
	mk("state/k8s/attach-1")
	mk("run/kurma/cni.sock")
	o := uninstallOpts{owner: "kurma-agent", nftTables: []string{"kurma-agent", "kurma-agent"}, routeProtocol: 76,
		stateDir: filepath.Join(dir, "state"), binDir: filepath.Join(dir, "bin"), confDir: filepath.Join(dir, "conf"),
		extraDirs: []string{filepath.Join(dir, "run/kurma"), filepath.Join(dir, "missing")}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 2 { // the second run finds nothing and is no error
		if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return uninstallHost(context.Background(), o, log) }); err != nil {
			t.Fatal(err)
		}
	}
	links := nettest.IP(t, nsPath, "-o", "link", "show")
	if strings.Contains(links, "kap1") || strings.Contains(links, "kab5") || !strings.Contains(links, "other0") {
		t.Errorf("links after uninstall:\n%s", links)
	}
	routes := nettest.IP(t, nsPath, "route", "show")
	if strings.Contains(routes, "10.96.0.0/12") || !strings.Contains(routes, "10.1.0.0/16") {
		t.Errorf("routes after uninstall:\n%s", routes)
	}
	if tables := nft("list", "tables"); strings.Contains(tables, "kurma-agent") || !strings.Contains(tables, "inet other") {
		t.Errorf("tables after uninstall:\n%s", tables)
	}
	var left []string
	_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && p != dir {
			left = append(left, strings.TrimPrefix(p, dir+"/"))
		}
		return nil
	})
	want := []string{"bin", "bin/loopback", "conf", "conf/20-other.conflist", "run"}
	if strings.Join(left, ",") != strings.Join(want, ",") {
		t.Errorf("files after uninstall %q, want %q", left, want)
	}
}
