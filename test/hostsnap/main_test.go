package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/testutil"
)

func TestDiff(t *testing.T) {
	base := func() *Snapshot {
		return &Snapshot{Links: []string{"lo (device)"}, NFTTables: []string{"table inet x"},
			Mounts: []string{"/ (ext4)"}, Sysctls: map[string]string{"net/ipv4/ip_forward": "0"},
			Cgroups: []string{"/sys/fs/cgroup/memory/a"}, State: []string{"/run/netns/"}}
	}
	tests := []struct {
		name   string
		change func(*Snapshot)
		want   []string
	}{
		{"same", func(*Snapshot) {}, nil},
		{"link added", func(s *Snapshot) { s.Links = append(s.Links, "kurma0 (bridge)") }, []string{"+ link kurma0 (bridge)"}},
		{"table gone", func(s *Snapshot) { s.NFTTables = nil }, []string{"- nft table table inet x"}},
		{"sysctl", func(s *Snapshot) { s.Sysctls["net/ipv4/ip_forward"] = "1" }, []string{"sysctl net/ipv4/ip_forward: 0 -> 1"}},
		{"cgroup and state", func(s *Snapshot) {
			s.Cgroups = append(s.Cgroups, "/sys/fs/cgroup/memory/kurma")
			s.State = append(s.State, "/var/lib/kurma/")
		}, []string{"+ cgroup /sys/fs/cgroup/memory/kurma", "+ state /var/lib/kurma/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			after := base()
			tt.change(after)
			if got := Diff(base(), after); !slices.Equal(got, tt.want) {
				t.Errorf("Diff = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestTidyFirstRun runs the check's tidying on a real folder that plays
// /run/netns: made or bind-mounted onto itself during the "run", as
// ip-netns(8) does, in every combination of what existed before.
func TestTidyFirstRun(t *testing.T) {
	testutil.RequireRoot(t)
	type state struct{ exists, mounted, entry bool }
	tests := []struct {
		name          string
		before, after state
		want          string // the message; "" for none
		diff          bool   // the check still reports a difference
	}{
		{"made, mounted, empty", state{}, state{exists: true, mounted: true}, "unmounted and removed", false},
		{"made, not mounted, empty", state{}, state{exists: true}, "removed", false},
		{"made, mounted, holds an entry", state{}, state{exists: true, mounted: true, entry: true}, "", true},
		{"made, not mounted, holds an entry", state{}, state{exists: true, entry: true}, "", true},
		{"existed, mounted by the run, empty", state{exists: true}, state{exists: true, mounted: true}, "unmounted", false},
		{"existed, mounted by the run, holds an entry", state{exists: true}, state{exists: true, mounted: true, entry: true}, "", true},
		{"existed mounted, still", state{exists: true, mounted: true}, state{exists: true, mounted: true}, "", false},
		{"existed, untouched", state{exists: true}, state{exists: true}, "", false},
		{"existed, removed by the run", state{exists: true}, state{}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "netns")
			t.Cleanup(func() {
				for isMounted(dir) {
					if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
						t.Errorf("cleanup: %v", err)
						return
					}
				}
			})
			apply := func(s state) {
				t.Helper()
				if !s.exists {
					if err := os.RemoveAll(dir); err != nil {
						t.Fatal(err)
					}
					return
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if s.mounted && !isMounted(dir) {
					if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
						t.Fatal(err)
					}
				}
				if s.entry {
					if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			snap := func() *Snapshot {
				t.Helper()
				s, err := take()
				if err != nil {
					t.Fatal(err)
				}
				recordDir(s, dir)
				slices.Sort(s.State)
				return s
			}
			apply(tt.before)
			before := snap()
			apply(tt.after)
			msgs := tidyFirstRun([]string{dir}, before, snap())
			switch {
			case tt.want == "" && len(msgs) > 0:
				t.Fatalf("tidy did %q, want nothing", msgs)
			case tt.want != "" && (len(msgs) != 1 || !strings.HasPrefix(msgs[0], tt.want+" "+dir)):
				t.Fatalf("tidy did %q, want %q", msgs, tt.want+" "+dir+"...")
			}
			var diff []string
			for _, d := range Diff(before, snap()) {
				if strings.Contains(d, dir) {
					diff = append(diff, d)
				}
			}
			if (len(diff) > 0) != tt.diff {
				t.Errorf("difference after tidy: %q, want one: %v", diff, tt.diff)
			}
		})
	}
}

// TestFresh removes an empty first-run folder, mounted or not, and keeps
// one with entries.
func TestFresh(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	empty, mounted, full := filepath.Join(root, "empty"), filepath.Join(root, "mounted"), filepath.Join(root, "full")
	for _, d := range []string{empty, mounted, full} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(mounted, mounted, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for isMounted(mounted) {
			_ = unix.Unmount(mounted, unix.MNT_DETACH)
		}
	})
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	msgs := fresh([]string{empty, mounted, full, filepath.Join(root, "absent")})
	for _, d := range []string{empty, mounted} {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: stat = %v, want it removed (%q)", d, err, msgs)
		}
	}
	if _, err := os.Stat(filepath.Join(full, "x")); err != nil {
		t.Errorf("%s: %v, want it kept", full, err)
	}
	if len(msgs) != 3 || !strings.HasPrefix(msgs[2], "kept "+full) {
		t.Errorf("fresh said %q", msgs)
	}
}
