package pod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/mountinfo"
	"kurma.dev/kurma/internal/pod/stageinit"
)

// cgroupMount is one cgroup hierarchy mounted on the host (v1 controller,
// named v1 hierarchy, or cgroup2).
type cgroupMount struct {
	Path string // mount point, e.g. /sys/fs/cgroup/memory
	V2   bool
}

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	Dev    string // major:minor
	Root   string // the mounted folder of the file system
	Point  string
	FSType string
}

func readMountInfo() ([]mountInfo, error) { return readMountInfoOf("self") }

// readMountInfoOf reads the mount table of process pid ("self" for this
// one).
func readMountInfoOf(pid string) ([]mountInfo, error) {
	f, err := os.Open("/proc/" + pid + "/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	return parseMountInfo(f)
}

// parseMountInfo reads mountinfo lines (proc(5)); malformed ones are
// skipped.
func parseMountInfo(r io.Reader) ([]mountInfo, error) {
	var out []mountInfo
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mountInfo{Dev: fields[2], Root: mountinfo.Unescape(fields[3]), Point: mountinfo.Unescape(fields[4]), FSType: fields[sep+1]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

func findCgroupMounts() ([]cgroupMount, error) {
	mis, err := readMountInfo()
	if err != nil {
		return nil, err
	}
	return cgroupMounts(mis), nil
}

// cgroupMounts picks the cgroup hierarchies out of a mount table: every
// cgroup (v1) and cgroup2 mount under /sys/fs/cgroup, once each. A pure
// v2 host has one, /sys/fs/cgroup itself; a hybrid one v1 controllers plus
// cgroup2 at /sys/fs/cgroup/unified.
func cgroupMounts(mis []mountInfo) []cgroupMount {
	seen := map[string]bool{}
	var out []cgroupMount
	for _, m := range mis {
		if (m.FSType != "cgroup" && m.FSType != "cgroup2") || seen[m.Point] {
			continue
		}
		if !strings.HasPrefix(m.Point, "/sys/fs/cgroup") {
			continue
		}
		seen[m.Point] = true
		out = append(out, cgroupMount{Path: m.Point, V2: m.FSType == "cgroup2"})
	}
	return out
}

// stagerCgroups pairs the pod's cgroup folders (dirs, one per hierarchy,
// in the order of cgs) with the hierarchies' mount points, where stage-init
// binds them inside the stager's root, and tells whether /sys/fs/cgroup
// itself is cgroup2 (then stage-init binds the pod's folder there instead
// of making a tmpfs to hold one folder per v1 hierarchy).
func stagerCgroups(cgs []cgroupMount, dirs []string) (binds []stageinit.Bind, v2only bool) {
	for i, cg := range cgs {
		if i < len(dirs) {
			binds = append(binds, stageinit.Bind{Source: dirs[i], Target: cg.Path})
			v2only = v2only || (cg.V2 && cg.Path == "/sys/fs/cgroup")
		}
	}
	return binds, v2only
}

// removeEmptyCgroupRoots removes <hierarchy>/<root> where no pod's cgroup
// is left under it (the kernel refuses to remove a cgroup with children,
// so pods that outlive the daemon keep theirs), leaving the host's cgroup
// tree as the daemon found it.
func (r *Runtime) removeEmptyCgroupRoots() {
	r.cgMu.Lock()
	defer r.cgMu.Unlock()
	for _, cg := range r.cgroups {
		root := filepath.Join(cg.Path, r.opts.CgroupRoot)
		// EBUSY without child folders: the last pod's processes are still
		// being torn down; give them a moment.
		for range 100 {
			err := unix.Rmdir(root)
			if !errors.Is(err, unix.EBUSY) || hasSubdir(root) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func hasSubdir(dir string) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			return true
		}
	}
	return false
}

// makeCgroups creates <hierarchy>/<root>/<uuid> in every hierarchy and
// returns the folders made (already made ones on error, for the undo).
func (r *Runtime) makeCgroups(uuid string) ([]string, error) {
	r.cgMu.Lock()
	defer r.cgMu.Unlock()
	var made []string
	for _, cg := range r.cgroups {
		dir, err := r.makeCgroup(cg, uuid)
		if err != nil {
			return made, err
		}
		made = append(made, dir)
	}
	return made, nil
}

// makeCgroup creates <hierarchy>/<root>/<uuid> in one hierarchy. Another
// daemon sharing the root may remove it, empty, at its exit
// (removeEmptyCgroupRoots) between the making of the parent and of the
// pod's folder: the parent is then made again.
func (r *Runtime) makeCgroup(cg cgroupMount, uuid string) (string, error) {
	for attempt := 0; ; attempt++ {
		dir, err := r.makeCgroupOnce(cg, uuid)
		if errors.Is(err, os.ErrNotExist) && attempt < 3 {
			continue
		}
		return dir, err
	}
}

func (r *Runtime) makeCgroupOnce(cg cgroupMount, uuid string) (string, error) {
	parent := filepath.Join(cg.Path, r.opts.CgroupRoot)
	if err := mkdirCgroup(parent); errors.Is(err, os.ErrExist) {
		// Made by an earlier kurmad or another pod: complete it all
		// the same, in case its maker has not finished yet.
		err = fillCpuset(parent)
		if err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("create cgroup %s: %w", parent, err)
	}
	if cg.V2 {
		delegateControllers(parent)
	}
	dir := filepath.Join(parent, uuid)
	if err := mkdirCgroup(dir); err != nil {
		return "", fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	return dir, nil
}

// mkdirCgroup makes a cgroup folder; in a v1 cpuset hierarchy it copies
// the parent's cpus and mems, without which no task could join.
func mkdirCgroup(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return fillCpuset(dir)
}

// fillCpuset copies the parent's cpuset.cpus and cpuset.mems into a v1
// cpuset folder where they are empty (elsewhere it does nothing).
func fillCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		p := filepath.Join(dir, f)
		cur, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(cur)) != "" {
			continue
		}
		v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			continue
		}
		if err := os.WriteFile(p, v, 0o644); err != nil {
			return fmt.Errorf("set %s: %w", p, err)
		}
	}
	return nil
}

// delegateControllers enables, in a cgroup2 folder, every controller it has
// for its children (the pods), so a stager can use them. Best effort: a
// controller the kernel refuses is left out.
func delegateControllers(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return
	}
	cur, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	have := strings.Fields(string(cur))
	for _, c := range strings.Fields(string(b)) {
		if !slices.Contains(have, c) {
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0o644)
		}
	}
}

// joinCgroups moves pid into every cgroup folder.
func joinCgroups(dirs []string, pid int) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("join cgroup %s: %w", d, err)
		}
	}
	return nil
}

// cgroupPids lists the processes in a cgroup folder and its descendants.
func cgroupPids(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, l := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(l); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// removeCgroups removes the folders, deepest first, after killing every
// process still in them. Missing folders are fine. Pod cgroups are
// usually empty by then (the stager was PID 1 of the pod's PID namespace,
// whose processes died with it), so removal is tried first and the scan
// for processes only made when a folder is still busy.
func removeCgroups(dirs []string) error {
	if rmdirCgroups(dirs, false) == nil {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := 0
		for _, d := range dirs {
			for _, pid := range cgroupPids(d) {
				left++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return rmdirCgroups(dirs, true)
}

// rmdirCgroups removes the folders and their sub-folders, deepest first.
// With wait, a folder that is busy is retried for a second: a cgroup
// lingers briefly after its last task is reaped.
func rmdirCgroups(dirs []string, wait bool) error {
	var errs []error
	for _, d := range dirs {
		var sub []string
		_ = filepath.WalkDir(d, func(p string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				sub = append(sub, p)
			}
			return nil
		})
		sort.Slice(sub, func(i, j int) bool { return len(sub[i]) > len(sub[j]) })
		for _, s := range sub {
			err := unix.Rmdir(s)
			for i := 0; wait && i < 500 && errors.Is(err, unix.EBUSY); i++ {
				time.Sleep(2 * time.Millisecond)
				err = unix.Rmdir(s)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", s, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	mis, err := readMountInfo()
	if err != nil {
		return err
	}
	var pts []string
	for _, m := range mis {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			pts = append(pts, m.Point)
		}
	}
	sort.Slice(pts, func(i, j int) bool { return len(pts[i]) > len(pts[j]) })
	var errs []error
	for _, p := range pts {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
