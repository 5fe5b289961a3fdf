package pod

import (
	"reflect"
	"strings"
	"testing"
)

// Mount tables of the three cgroup set-ups, as /proc/self/mountinfo shows
// them (trimmed to the fields the parser reads).
const (
	mountsV2 = `25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
31 25 0:27 / /run/netns rw shared:1 - tmpfs tmpfs rw
`
	mountsHybrid = `25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
36 25 0:31 / /mnt/elsewhere rw,relatime - cgroup2 cgroup2 rw
37 25 0:32 / /sys/fs/cgroup\040x rw - cgroup cgroup rw,pids
bad line
`
	mountsV1 = `25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
32 30 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
`
)

// TestCgroupDecisions: which hierarchies kurmad uses, and how stage-init
// is told to lay them out in the stager's root, on a pure cgroup v2, a
// hybrid and a pure v1 host.
func TestCgroupDecisions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mountinfo  string
		want       []cgroupMount
		wantV2Only bool
	}{
		{"v2", mountsV2, []cgroupMount{{Path: "/sys/fs/cgroup", V2: true}}, true},
		{"hybrid", mountsHybrid, []cgroupMount{
			{Path: "/sys/fs/cgroup/unified", V2: true},
			{Path: "/sys/fs/cgroup/systemd"},
			{Path: "/sys/fs/cgroup/cpu,cpuacct"},
			{Path: "/sys/fs/cgroup/memory"},
			{Path: "/sys/fs/cgroup x"},
		}, false},
		{"v1", mountsV1, []cgroupMount{{Path: "/sys/fs/cgroup/pids"}}, false},
		{"none", "25 1 0:22 / / rw - ext4 /dev/vda rw\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mis, err := parseMountInfo(strings.NewReader(tc.mountinfo))
			if err != nil {
				t.Fatal(err)
			}
			got := cgroupMounts(mis)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("cgroupMounts = %+v, want %+v", got, tc.want)
			}
			dirs := make([]string, len(got))
			for i, cg := range got {
				dirs[i] = cg.Path + "/kurma/pod"
			}
			binds, v2only := stagerCgroups(got, dirs)
			if v2only != tc.wantV2Only {
				t.Errorf("v2only = %v, want %v", v2only, tc.wantV2Only)
			}
			if len(binds) != len(got) {
				t.Fatalf("binds %+v", binds)
			}
			for i, b := range binds {
				if b.Source != dirs[i] || b.Target != got[i].Path {
					t.Errorf("bind %d = %+v", i, b)
				}
			}
			// Fewer folders than hierarchies (a creation that failed
			// half-way): only those made are bound.
			if len(got) > 1 {
				if b, _ := stagerCgroups(got, dirs[:1]); len(b) != 1 {
					t.Errorf("binds for one folder: %+v", b)
				}
			}
		})
	}
}

// FuzzMountInfo feeds mount tables to the parser the cgroup and spare
// logic read.
func FuzzMountInfo(f *testing.F) {
	for _, s := range []string{mountsV2, mountsHybrid, mountsV1, "", "1 2 3 4 5 6 - x\n", "a b c d \\ f g - h i\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mis, err := parseMountInfo(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, cg := range cgroupMounts(mis) {
			if !strings.HasPrefix(cg.Path, "/sys/fs/cgroup") {
				t.Fatalf("hierarchy outside /sys/fs/cgroup: %q", cg.Path)
			}
		}
	})
}
