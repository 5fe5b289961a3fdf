package cniconformance

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snapshotCmds are the views of a netns the harness compares. Commands whose
// binary is missing (iptables on an nft-only host) are skipped.
var snapshotCmds = [][]string{
	{"ip", "-br", "link"},
	{"ip", "-br", "addr"},
	{"ip", "-4", "route", "show", "table", "all"},
	{"ip", "-6", "route", "show", "table", "all"},
	{"ip", "-4", "rule"},
	{"ip", "-6", "rule"},
	{"nft", "list", "ruleset"},
	{"iptables-save"},
	{"ip6tables-save"},
}

var (
	counters    = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounters = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// Snapshot returns the sorted network state of the netns at nsPath ("" for
// the test process's own netns), one "view: line" per line.
func Snapshot(t testing.TB, nsPath string) []string {
	t.Helper()
	var out []string
	for _, c := range snapshotCmds {
		if _, err := exec.LookPath(c[0]); err != nil {
			continue
		}
		args := c
		if nsPath != "" {
			args = append([]string{"nsenter", "--net=" + nsPath}, c...)
		}
		b, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("snapshot %v: %v\n%s", args, err, b)
		}
		view := strings.Join(c, " ")
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "#") || volatile(l) {
				continue
			}
			out = append(out, view+": "+normalize(c, l))
		}
	}
	slices.Sort(out)
	return out
}

// Filter keeps the lines that contain one of the markers.
func Filter(lines []string, markers []string) []string {
	var out []string
	for _, l := range lines {
		for _, m := range markers {
			if m != "" && strings.Contains(strings.ToLower(l), strings.ToLower(m)) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// Diff describes lines only in before ("-") and only in after ("+"); empty
// when both are equal.
func Diff(before, after []string) string {
	var b strings.Builder
	for _, l := range before {
		if !slices.Contains(after, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

// normalize drops what flaps without anyone changing configuration: the
// operational state of links (a bridge loses carrier some time after its
// last port goes), "linkdown" on routes, and rule counters.
func normalize(cmd []string, l string) string {
	l = counters.ReplaceAllString(l, "[]")
	l = nftCounters.ReplaceAllString(l, "counter")
	if len(cmd) > 1 && cmd[1] == "-br" {
		if f := strings.Fields(l); len(f) >= 2 {
			f = append(f[:1], f[2:]...)
			l = strings.Join(f, " ")
		}
		l = strings.ReplaceAll(l, "NO-CARRIER,", "")
	}
	return strings.ReplaceAll(l, " linkdown", "")
}

// volatile lines come and go with link carrier: the kernel's IPv6
// link-local and multicast routes.
func volatile(l string) bool {
	return strings.Contains(l, "fe80::") && !strings.Contains(l, "/64 ") && strings.Contains(l, "table local") ||
		strings.HasPrefix(l, "fe80::/64 ") || strings.HasPrefix(l, "multicast ff00::/8 ")
}
