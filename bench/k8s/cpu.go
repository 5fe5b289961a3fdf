package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat (100
// on every Linux this runs on).
const clockTicks = 100

// cpuTimes is the CPU time, in clock ticks, each of the cluster's
// processes (by name) has used: its own and its live descendants' (user
// and system), plus the children each of them has waited for (a CNI
// plugin exec'd by containerd counts in containerd's).
type cpuTimes map[string]int64

// sampleCPU reads the CPU times of the cluster's processes now. CPU time
// is a fair measure on a loaded machine, where wall-clock time is not:
// what a setup costs the node in a burst, beyond the others.
func sampleCPU(c *kubecluster.Cluster) cpuTimes {
	stats := readProcStats()
	kids := map[int][]int{}
	for pid, s := range stats {
		kids[s.ppid] = append(kids[s.ppid], pid)
	}
	out := cpuTimes{}
	for _, p := range c.Processes() {
		if p.Cmd == nil || p.Cmd.Process == nil {
			continue
		}
		var total int64
		todo := []int{p.PID()}
		seen := map[int]bool{}
		for len(todo) > 0 {
			pid := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			if seen[pid] {
				continue
			}
			seen[pid] = true
			if s, ok := stats[pid]; ok {
				total += s.ticks
			}
			todo = append(todo, kids[pid]...)
		}
		out[p.Name] += total
	}
	return out
}

// machineCPU reads the busy and total CPU time of the whole machine, in
// clock ticks, from the first line of /proc/stat (busy: all but idle and
// iowait).
func machineCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	// user nice system idle iowait irq softirq steal [guest guest_nice]
	// (guest time is already counted in user).
	for i, x := range f[1:9] {
		n, _ := strconv.ParseInt(x, 10, 64)
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total
}

type procStat struct {
	ppid  int
	ticks int64 // utime + stime + cutime + cstime
}

// readProcStats reads /proc/<pid>/stat of every process.
func readProcStats() map[int]procStat {
	out := map[int]procStat{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// The command name, in parentheses, may hold spaces: the fields
		// are counted after its closing parenthesis.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		var ticks int64
		for _, x := range f[11:15] {
			n, _ := strconv.ParseInt(x, 10, 64)
			ticks += n
		}
		out[pid] = procStat{ppid: ppid, ticks: ticks}
	}
	return out
}

// cpuDelta is the CPU seconds per process between two samples, scaled to
// per 100 pods of a burst of n.
func cpuDelta(before, after cpuTimes, n int) map[string]float64 {
	out := map[string]float64{}
	for name, t := range after {
		if d := t - before[name]; d > 0 {
			out[name] = float64(d) / clockTicks * 100 / float64(n)
		}
	}
	return out
}

// formatCPU prints CPU seconds per process, largest first, and the total.
func formatCPU(cpu map[string]float64) string {
	names := make([]string, 0, len(cpu))
	var total float64
	for name, s := range cpu {
		names = append(names, name)
		total += s
	}
	slices.SortFunc(names, func(a, b string) int {
		if cpu[a] != cpu[b] {
			if cpu[a] > cpu[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := []string{fmt.Sprintf("total %.2f", total)}
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, cpu[name]))
	}
	return strings.Join(parts, ", ")
}
