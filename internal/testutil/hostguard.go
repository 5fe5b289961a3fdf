package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// forwardingSysctls are the settings that network code under test (the
// upstream bridge plugin with isGateway, the agent, podman, containerd)
// turns on in the host netns.
var forwardingSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/forwarding",
	"net/ipv6/conf/all/forwarding",
	"net/ipv6/conf/default/forwarding",
	"net/bridge/bridge-nf-call-iptables",                // the agent's NetworkPolicy path
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", // the agent in Kubernetes mode
}

// peerTables are nft tables that test peers make in the host netns and
// never remove: iptables-nft's (the upstream plugins' iptables backend)
// and the upstream bridge plugin's masquerade table.
var peerTables = []string{
	"ip nat", "ip filter", "ip mangle", "ip6 nat", "ip6 filter", "ip6 mangle",
	"inet cni_plugins_masquerade",
}

// peerDirs are folders test peers make on first use and leave empty:
// libcni's default cache, which cnitool always uses. Deepest first.
var peerDirs = []string{"/var/lib/cni/results", "/var/lib/cni"}

// KeepHost runs a host package's tests (call it from TestMain as
// os.Exit(testutil.KeepHost(m))) and then puts back what they changed in
// the host netns that no single test owns: the forwarding sysctls get their
// old values, and the peers' nft tables that did not exist before are
// removed when they hold no rule (a rule left is a leak to report, not to
// hide), and the peers' folders that did not exist before are removed when
// empty.
func KeepHost(m *testing.M) int {
	var newDirs []string
	for _, d := range peerDirs {
		if _, err := os.Stat(d); err != nil {
			newDirs = append(newDirs, d)
		}
	}
	sysctls := map[string]string{}
	for _, s := range forwardingSysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			sysctls[s] = string(bytes.TrimSpace(b))
		}
	}
	tables := nftTables()
	code := m.Run()
	for s, v := range sysctls {
		p := filepath.Join("/proc/sys", s)
		if b, err := os.ReadFile(p); err == nil && string(bytes.TrimSpace(b)) != v {
			if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "restore %s: %v\n", s, err)
				code = 1
			}
		}
	}
	for _, t := range nftTables() {
		if slices.Contains(tables, t) || !slices.Contains(peerTables, t) {
			continue
		}
		args := append([]string{"-j", "list", "table"}, strings.Fields(t)...)
		out, err := exec.Command("nft", args...).Output()
		if err != nil || bytes.Contains(out, []byte(`"rule"`)) {
			continue
		}
		if out, err := exec.Command("nft", append([]string{"delete", "table"}, strings.Fields(t)...)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "delete nft table %s: %v: %s\n", t, err, out)
			code = 1
		}
	}
	for _, d := range newDirs {
		_ = os.Remove(d) // only when empty
	}
	return code
}

// nftTables lists the host netns's tables as "family name".
func nftTables() []string {
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		return nil
	}
	var ts []string
	for _, l := range strings.Split(string(out), "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(l), "table "); ok {
			ts = append(ts, t)
		}
	}
	return ts
}
