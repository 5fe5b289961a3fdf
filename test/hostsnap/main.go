// Command hostsnap records the host state that Kurma's tests and demo may
// change, and later checks that it is as recorded: `make test` runs
// `hostsnap save FILE` before the tests and `hostsnap check FILE` after
// them, so a run that leaves anything behind fails.
//
// What it records: the host netns's links and nft tables, the named netns
// under /run/netns, the mount points, the forwarding sysctls the network
// code may turn on, the first level of every cgroup hierarchy, and the
// entries of the state folders Kurma and its test peers use. `check`
// writes the recorded value back into every sysctl that differs (so the
// host is left as found even when the check fails), prints each
// difference and exits 1 if there is any.
//
// A folder that only a first run creates (firstRunDirs: /run/netns) and
// that the run leaves empty is put back as found, and `fresh` removes such
// folders when empty, so that CI on a used machine starts from what a
// fresh machine has.
//
// Usage: hostsnap save FILE | hostsnap check FILE | hostsnap fresh
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// sysctls are the settings the network code (ours and the upstream CNI
// plugins, podman, containerd) may turn on.
var sysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/forwarding",
	"net/ipv4/conf/default/forwarding",
	"net/ipv6/conf/all/forwarding",
	"net/ipv6/conf/default/forwarding",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",                // NetworkPolicy (policypath) turns it on
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", // the agent in Kubernetes mode, as kube-proxy
}

// stateDirs are folders whose entries are compared.
var stateDirs = []string{
	"/var/lib/kurma", "/var/lib/kurma-network", "/run/kurma", "/run/netns",
	"/etc/cni/net.d", "/var/lib/cni", "/var/lib/cni/networks", "/opt/cni/bin",
}

// Snapshot is the recorded host state; every list is sorted.
type Snapshot struct {
	Links     []string          `json:"links"`
	NFTTables []string          `json:"nftTables"`
	Mounts    []string          `json:"mounts"`
	Sysctls   map[string]string `json:"sysctls"`
	Cgroups   []string          `json:"cgroups"`
	State     []string          `json:"state"`
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "fresh" {
		for _, m := range fresh(firstRunDirs) {
			fmt.Println("hostsnap: " + m)
		}
		return
	}
	if len(os.Args) != 3 || (os.Args[1] != "save" && os.Args[1] != "check") {
		fmt.Fprintln(os.Stderr, "usage: hostsnap save FILE | hostsnap check FILE | hostsnap fresh")
		os.Exit(2)
	}
	now, err := take()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostsnap: %v\n", err)
		os.Exit(1)
	}
	file := os.Args[2]
	if os.Args[1] == "save" {
		b, _ := json.MarshalIndent(now, "", "  ")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "hostsnap: %v\n", err)
			os.Exit(1)
		}
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostsnap: %v\n", err)
		os.Exit(1)
	}
	var before Snapshot
	if err := json.Unmarshal(b, &before); err != nil {
		fmt.Fprintf(os.Stderr, "hostsnap: %s: %v\n", file, err)
		os.Exit(1)
	}
	// Folders that the first test to need them creates (the /run/netns
	// bind mount above all) cannot be removed by that test while others
	// run: put them back as the run found them when it left them empty.
	if msgs := tidyFirstRun(firstRunDirs, &before, now); len(msgs) > 0 {
		for _, m := range msgs {
			fmt.Println("hostsnap: " + m)
		}
		if now, err = take(); err != nil {
			fmt.Fprintf(os.Stderr, "hostsnap: %v\n", err)
			os.Exit(1)
		}
	}
	diff := Diff(&before, now)
	for name, v := range before.Sysctls {
		if now.Sysctls[name] != v && v != "" {
			if err := os.WriteFile(filepath.Join("/proc/sys", name), []byte(v), 0o644); err != nil {
				diff = append(diff, fmt.Sprintf("restore %s: %v", name, err))
			} else {
				diff = append(diff, fmt.Sprintf("(restored %s to %s)", name, v))
			}
		}
	}
	if len(diff) > 0 {
		fmt.Fprintf(os.Stderr, "hostsnap: the host differs from %s (- before, + after):\n  %s\n", file, strings.Join(diff, "\n  "))
		os.Exit(1)
	}
	fmt.Println("hostsnap: the host is as it was")
}

// firstRunDirs are the folders a run creates when the host lacks them and
// that no single test can remove: /run/netns, made (and bind-mounted onto
// itself, as ip-netns(8) does) by whichever test adds the first named
// network namespace while other packages still run. Each must also be one
// of stateDirs, whose snapshot records whether it existed.
var firstRunDirs = []string{"/run/netns"}

func isMountedAt(s *Snapshot, dir string) bool {
	return slices.ContainsFunc(s.Mounts, func(m string) bool { return strings.HasPrefix(m, dir+" (") })
}

// tidyFirstRun puts each of dirs back as before recorded it, when the run
// left it empty: a folder that did not exist is unmounted and removed; one
// that existed but was not a mount point is unmounted. A folder that holds
// anything is left alone (the check reports its entries). It returns what
// it did, one line each.
func tidyFirstRun(dirs []string, before, now *Snapshot) []string {
	var msgs []string
	for _, dir := range dirs {
		if msg, err := tidyDir(dir, before, now); err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: %v", dir, err))
		} else if msg != "" {
			msgs = append(msgs, msg)
		}
	}
	return msgs
}

func tidyDir(dir string, before, now *Snapshot) (string, error) {
	existed := slices.Contains(before.State, dir+"/")
	wasMount, isMount := isMountedAt(before, dir), isMountedAt(now, dir)
	if existed && (wasMount || !isMount) {
		return "", nil // as it was, or something else the check reports
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || len(ents) > 0 {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	unmounted := false
	for isMounted(dir) {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return "", fmt.Errorf("unmount: %w", err)
		}
		unmounted = true
	}
	if existed {
		return "unmounted " + dir + ", mounted by the run and left empty", nil
	}
	if err := unix.Rmdir(dir); err != nil {
		return "", fmt.Errorf("remove: %w", err)
	}
	if unmounted {
		return "unmounted and removed " + dir + ", made by the run and left empty", nil
	}
	return "removed " + dir + ", made by the run and left empty", nil
}

// fresh makes each of dirs absent when it is empty, unmounting it first,
// so that the next run starts as on a machine that never ran the tests
// (`.ci/run` calls it before `make test`). A folder with entries stays.
func fresh(dirs []string) []string {
	var msgs []string
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil || len(ents) > 0 {
			msgs = append(msgs, fmt.Sprintf("kept %s (%d entries, %v)", dir, len(ents), err))
			continue
		}
		for isMounted(dir) {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				msgs = append(msgs, fmt.Sprintf("kept %s: unmount: %v", dir, err))
				break
			}
		}
		if err := unix.Rmdir(dir); err != nil {
			msgs = append(msgs, fmt.Sprintf("kept %s: %v", dir, err))
			continue
		}
		msgs = append(msgs, "removed "+dir+" (empty), as a machine that never ran the tests lacks it")
	}
	return msgs
}

// isMounted reports whether dir is a mount point now.
func isMounted(dir string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range lines(string(mi)) {
		if f := strings.Fields(l); len(f) >= 5 && f[4] == dir {
			return true
		}
	}
	return false
}

// Diff lists the differences between two snapshots, one line each.
func Diff(a, b *Snapshot) []string {
	var out []string
	lists := []struct {
		what string
		a, b []string
	}{
		{"link", a.Links, b.Links}, {"nft table", a.NFTTables, b.NFTTables}, {"mount", a.Mounts, b.Mounts},
		{"cgroup", a.Cgroups, b.Cgroups}, {"state", a.State, b.State},
	}
	for _, l := range lists {
		for _, x := range l.a {
			if !slices.Contains(l.b, x) {
				out = append(out, fmt.Sprintf("- %s %s", l.what, x))
			}
		}
		for _, x := range l.b {
			if !slices.Contains(l.a, x) {
				out = append(out, fmt.Sprintf("+ %s %s", l.what, x))
			}
		}
	}
	for _, name := range sortedKeys(a.Sysctls, b.Sysctls) {
		// A setting absent before came with a module the run loaded
		// (nf_conntrack, br_netfilter on a modular kernel): not a change
		// of the host's.
		if _, was := a.Sysctls[name]; was && a.Sysctls[name] != b.Sysctls[name] {
			out = append(out, fmt.Sprintf("sysctl %s: %s -> %s", name, a.Sysctls[name], b.Sysctls[name]))
		}
	}
	return out
}

func sortedKeys(ms ...map[string]string) []string {
	var keys []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

func take() (*Snapshot, error) {
	s := &Snapshot{Sysctls: map[string]string{}}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		s.Links = append(s.Links, l.Attrs().Name+" ("+l.Type()+")")
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		s.NFTTables = lines(string(out))
	} else if !errors.Is(err, exec.ErrNotFound) {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	for _, l := range lines(string(mi)) {
		// Field 5 is the mount point; after " - " come the type and source.
		f := strings.Fields(l)
		_, tail, _ := strings.Cut(l, " - ")
		tf := strings.Fields(tail)
		if len(f) < 5 || len(tf) < 1 || tf[0] == "autofs" || strings.HasPrefix(f[4], "/proc/sys/fs/binfmt_misc") {
			continue
		}
		s.Mounts = append(s.Mounts, f[4]+" ("+tf[0]+")")
	}
	for _, name := range sysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err == nil {
			s.Sysctls[name] = strings.TrimSpace(string(b))
		}
	}
	hier, _ := os.ReadDir("/sys/fs/cgroup")
	roots := []string{"/sys/fs/cgroup"}
	for _, h := range hier {
		if h.IsDir() {
			roots = append(roots, filepath.Join("/sys/fs/cgroup", h.Name()))
		}
	}
	for _, r := range roots {
		ents, _ := os.ReadDir(r)
		for _, e := range ents {
			// Child cgroups are folders; in a cgroup v1 tmpfs root the
			// hierarchies themselves are folders too.
			if e.IsDir() && !slices.Contains(roots, filepath.Join(r, e.Name())) {
				s.Cgroups = append(s.Cgroups, filepath.Join(r, e.Name()))
			}
		}
	}
	for _, d := range stateDirs {
		recordDir(s, d)
	}
	for _, l := range [][]string{s.Links, s.NFTTables, s.Mounts, s.Cgroups, s.State} {
		slices.Sort(l)
	}
	return s, nil
}

// recordDir adds folder d ("d/", when it exists) and its entries to
// s.State.
func recordDir(s *Snapshot, d string) {
	ents, err := os.ReadDir(d)
	if err != nil {
		return
	}
	s.State = append(s.State, d+"/")
	for _, e := range ents {
		s.State = append(s.State, filepath.Join(d, e.Name()))
	}
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
