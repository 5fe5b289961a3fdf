package main

import (
	"slices"
	"testing"
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
