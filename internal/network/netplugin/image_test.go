package netplugin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/uuid"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
)

// imageRoot extracts bin/images/kurma-netplugin.aci into a temp dir and
// returns the manifest and the rootfs path.
func imageRoot(t *testing.T) (appc.ImageManifest, string) {
	t.Helper()
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "bin")
	}
	aci := filepath.Join(dir, "images", "kurma-netplugin.aci")
	if _, err := os.Stat(aci); err != nil {
		t.Skipf("%s not built (make build builds it)", aci)
	}
	out := t.TempDir()
	testutil.Run(t, "tar", "-xzf", aci, "-C", out)
	var m appc.ImageManifest
	b, err := os.ReadFile(filepath.Join(out, "manifest"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m, filepath.Join(out, "rootfs")
}

func TestImageManifest(t *testing.T) {
	m, root := imageRoot(t)
	if m.App == nil || strings.Join(m.App.Exec, " ") != "/netplugin" {
		t.Fatalf("exec %+v, want /netplugin", m.App)
	}
	priv := false
	for _, a := range m.Annotations {
		priv = priv || (a.Name == "kurma.dev/host-privileged" && a.Value == "true")
	}
	for _, l := range m.Labels {
		priv = priv || (l.Name == "kurma.dev/host-privileged" && l.Value == "true")
	}
	if !priv {
		t.Errorf("image does not declare kurma.dev/host-privileged=true: %+v %+v", m.Annotations, m.Labels)
	}
	for _, p := range []string{"netplugin", "opt/network/add", "opt/network/del", "usr/sbin/nft",
		"opt/cni/bin/bridge", "opt/cni/bin/host-local", "opt/cni/bin/loopback", "opt/cni/bin/portmap",
		"opt/cni/bin/ptp", "opt/cni/bin/macvlan", "opt/cni/bin/ipvlan", "opt/cni/bin/static",
		"opt/cni/bin/tuning", "opt/cni/bin/bandwidth", "opt/cni/bin/firewall"} {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s missing or not executable: %v", p, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "var/lib/kurma-network")); err != nil || !fi.IsDir() {
		t.Errorf("state dir missing: %v", err)
	}
}

// TestImageAddDel runs the image's own /opt/network/add and del in a chroot
// of its root filesystem (own mount namespace with /proc, /sys and /dev, as a container has; the pod's
// netns bind-mounted in, as the networking pod's volume would provide),
// with IP masquerade on: it proves the image's binaries, CNI plugins and nft
// work together without anything from the host.
func TestImageAddDel(t *testing.T) {
	_, root := imageRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) missing")
	}
	e := newEnv(t)
	pod := testutil.NewNetNS(t)
	id := uuid.NewString()
	for _, d := range []string{"proc", "sys", "dev", "run/netns"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	podPath := "/run/netns/" + filepath.Base(pod.Path())
	if err := os.WriteFile(filepath.Join(root, podPath), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": e.netName, "type": "bridge", "bridge": e.bridge,
		"isGateway": true, "ipMasq": true, "ipMasqBackend": "nftables",
		"ipam": map[string]any{"type": "host-local", "subnet": e.subnet},
	})
	call := func(verb string) (string, error) {
		script := fmt.Sprintf(`set -e
mount -t proc proc %[1]s/proc
mount -t sysfs sysfs %[1]s/sys
mount --bind /dev %[1]s/dev
mount --bind %[2]s %[1]s%[3]s
exec chroot %[1]s /opt/network/%[4]s %[3]s %[5]s eth0`, root, pod.Path(), podPath, verb, id)
		var out, errb bytes.Buffer
		err := e.host.Do(func(ns.NetNS) error {
			cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
			cmd.Stdin = bytes.NewReader(conf)
			cmd.Stdout, cmd.Stderr = &out, &errb
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
			return cmd.Run()
		})
		if err != nil {
			return out.String(), fmt.Errorf("%s: %v\nstdout %s\nstderr %s", verb, err, out.String(), errb.String())
		}
		return out.String(), nil
	}
	out, err := call("add")
	t.Cleanup(func() { _, _ = call("del") })
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		IPs []struct{ Address string } `json:"ips"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.IPs) != 1 {
		t.Fatalf("add result %q: %v", out, err)
	}
	ip, _, _ := strings.Cut(res.IPs[0].Address, "/")
	if got := addrsOf(t, pod, "eth0"); len(got) != 1 || !strings.HasPrefix(got[0], ip+"/") {
		t.Fatalf("pod eth0 addresses %v, want %s", got, ip)
	}
	if rs := e.nftRuleset(); !strings.Contains(rs, ip) || !strings.Contains(rs, "masquerade") {
		t.Fatalf("no masquerade rule for %s:\n%s", ip, rs)
	}
	if _, err := call("del"); err != nil {
		t.Fatal(err)
	}
	if rs := e.nftRuleset(); strings.Contains(rs, ip) {
		t.Fatalf("rule for %s left after del:\n%s", ip, rs)
	}
	if v := links(t, e.host, "veth"); len(v) != 0 {
		t.Fatalf("veths left %v", v)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "var/lib/kurma-network/cache/results")); len(ents) != 0 {
		t.Fatalf("cache left in the image's state dir: %d entries", len(ents))
	}
}
