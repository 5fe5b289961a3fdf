package pod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
)

// recordFile is the per-pod record, written atomically in the pod's folder.
const recordFile = "pod.json"

// record is what kurmad keeps on disk about a pod: the public Pod plus what
// teardown and re-adoption need.
type record struct {
	Pod Pod `json:"pod"`
	// StagerStart is the stager's start time in clock ticks since boot
	// (field 22 of /proc/<pid>/stat): a pid is ours only when it matches.
	StagerStart uint64 `json:"stagerStart,omitempty"`
	// Cgroups are the host cgroup folders made for the pod.
	Cgroups []string `json:"cgroups,omitempty"`
	// Leased is true once the pod's images are leased (holder = UUID).
	Leased bool `json:"leased,omitempty"`
	// Volumes is the folder of the pod's empty volumes.
	Volumes string `json:"volumes,omitempty"`
	// Stopping is set by Stop so that the stager's exit means Exited.
	Stopping bool `json:"stopping,omitempty"`
}

// entry is a pod in memory. rec and the flags are guarded by Runtime.mu;
// op serialises the pod's lifecycle operations (stop, remove, teardown).
type entry struct {
	op  sync.Mutex
	rec record
	// exited is closed once the stager has exited and the pod is torn down.
	exited chan struct{}
	// pidfd refers to the stager process (-1 when none).
	pidfd int
	// removing is set (under Runtime.mu) when a forced Remove stops the
	// pod: its record is about to go, so the stop skips the records and
	// the fsync that only matter for a pod that stays.
	removing bool
}

func (e *entry) snapshot() *Pod {
	p := e.rec.Pod
	p.Spec = cloneSpec(p.Spec)
	p.Apps = append([]AppInfo(nil), p.Apps...)
	for i, a := range p.Apps {
		if a.Status != nil {
			st := *a.Status
			p.Apps[i].Status = &st
		}
	}
	p.Networks = append([]json.RawMessage(nil), p.Networks...)
	return &p
}

func cloneSpec(s Spec) Spec {
	b, _ := json.Marshal(s)
	var c Spec
	_ = json.Unmarshal(b, &c)
	return c
}

// writeRecord stores rec atomically: temp file, optional fsync, rename, and
// fsync of the folder when durable is set (the record a restart depends on).
func writeRecord(dir string, rec *record, durable bool) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode pod record: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".pod-*.json")
	if err != nil {
		return fmt.Errorf("write pod record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write pod record: %w", err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return fmt.Errorf("sync pod record: %w", err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write pod record: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, recordFile)); err != nil {
		return fmt.Errorf("rename pod record: %w", err)
	}
	if durable {
		if d, err := os.Open(dir); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return nil
}

func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return nil, err
	}
	rec, err := parseRecord(b, filepath.Base(dir))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, recordFile), err)
	}
	return rec, nil
}

// parseRecord decodes a pod record and checks it before recovery trusts
// it: it must name the folder it is in, and what teardown will remove must
// be cgroup folders of this pod.
func parseRecord(b []byte, uuid string) (*record, error) {
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("decode pod record: %w", err)
	}
	if rec.Pod.UUID != uuid {
		return nil, fmt.Errorf("record names pod %q", rec.Pod.UUID)
	}
	switch rec.Pod.State {
	case Creating, Running, Stopping, Exited, Errored:
	default:
		return nil, fmt.Errorf("unknown pod state %q", rec.Pod.State)
	}
	for _, cg := range rec.Cgroups {
		if filepath.Base(cg) != uuid || !strings.HasPrefix(cg, "/sys/fs/cgroup/") || filepath.Clean(cg) != cg {
			return nil, fmt.Errorf("record names foreign cgroup %q", cg)
		}
	}
	if rec.Volumes != "" && (filepath.Base(rec.Volumes) != uuid || filepath.Clean(rec.Volumes) != rec.Volumes) {
		return nil, fmt.Errorf("record names foreign volumes folder %q", rec.Volumes)
	}
	if rec.Pod.StagerPID < 0 {
		return nil, fmt.Errorf("negative stager pid")
	}
	return &rec, nil
}

// save persists an entry's record (taken under mu).
func (r *Runtime) save(e *entry, durable bool) error {
	r.mu.Lock()
	rec := e.rec
	rec.Pod = *e.snapshot()
	r.mu.Unlock()
	return writeRecord(r.podDir(rec.Pod.UUID), &rec, durable)
}

// procStartTime returns the start time (clock ticks since boot) of pid, or
// an error wrapping os.ErrNotExist when there is no such process.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	st, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// procExiting reports whether pid is exiting or gone: a zombie, no such
// process, or the kernel's PF_EXITING task flag, which do_exit sets before
// it closes the process's descriptors.
func procExiting(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	exiting, err := parseExiting(b)
	return err != nil || exiting
}

// pfExiting is the kernel's PF_EXITING task flag (include/linux/sched.h).
const pfExiting = 0x4

// parseExiting reads the state and flags fields of /proc/<pid>/stat.
func parseExiting(b []byte) (bool, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return false, errors.New("malformed stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After "pid (comm)": state is field 3, flags field 9.
	if len(f) < 7 {
		return false, errors.New("malformed stat: too few fields")
	}
	if f[0] == "Z" || f[0] == "X" {
		return true, nil
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return false, fmt.Errorf("malformed stat flags: %w", err)
	}
	return flags&pfExiting != 0, nil
}

// parseStat returns the start time from the content of /proc/<pid>/stat;
// a zombie or dead process counts as gone (os.ErrNotExist).
func parseStat(b []byte) (uint64, error) {
	// The command name is in parentheses and may hold anything, ')' too.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// After "pid (comm)": state is field 3, starttime field 22.
	if len(f) < 20 {
		return 0, errors.New("malformed stat: too few fields")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process is a zombie: %w", os.ErrNotExist)
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("malformed stat start time: %w", err)
	}
	return v, nil
}

// recover loads every pod record, re-adopts live stagers and settles the
// rest. Folders without a readable record are debris of an interrupted
// create: their mounts are detached and they are removed.
func (r *Runtime) recover(ctx context.Context) error {
	ents, err := os.ReadDir(r.opts.PodsDir)
	if err != nil {
		return fmt.Errorf("read pods dir: %w", err)
	}
	for _, de := range ents {
		if !de.IsDir() || de.Name() == trashDir {
			continue
		}
		dir := filepath.Join(r.opts.PodsDir, de.Name())
		rec, err := readRecord(dir)
		if err != nil {
			r.log.Warn("removing pod folder without a valid record", "dir", dir, "err", err)
			if err := unmountUnder(dir); err != nil {
				return err
			}
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("remove %s: %w", dir, err)
			}
			continue
		}
		e := &entry{rec: *rec, exited: make(chan struct{}), pidfd: -1}
		r.leaseKept(ctx, rec)
		switch rec.Pod.State {
		case Exited, Errored:
			close(e.exited)
			r.pods[rec.Pod.UUID] = e
			continue
		}
		alive := false
		if pid := rec.Pod.StagerPID; pid > 0 {
			if st, err := procStartTime(pid); err == nil && st == rec.StagerStart {
				if fd, err := unix.PidfdOpen(pid, 0); err == nil {
					// Check again now that the pidfd pins the process.
					if st2, err := procStartTime(pid); err == nil && st2 == st {
						e.pidfd = fd
						alive = true
					} else {
						unix.Close(fd)
					}
				}
			}
		}
		if rec.Pod.State == Creating {
			// An interrupted create: roll it back completely.
			r.log.Info("rolling back pod interrupted during creation", "pod", rec.Pod.UUID)
			if alive {
				_ = unix.PidfdSendSignal(e.pidfd, unix.SIGKILL, nil, 0)
				waitPidfd(ctx, e.pidfd, 5*time.Second)
				unix.Close(e.pidfd)
				e.pidfd = -1
			}
			r.teardown(ctx, e)
			if rec.Leased {
				if err := r.opts.Images.Unlease(ctx, rec.Pod.UUID); err != nil {
					return fmt.Errorf("roll back pod %s: %w", rec.Pod.UUID, err)
				}
			}
			if err := r.removeFiles(ctx, e); err != nil {
				return err
			}
			continue
		}
		r.pods[rec.Pod.UUID] = e
		if alive {
			r.log.Info("re-adopted pod", "pod", rec.Pod.UUID, "pid", rec.Pod.StagerPID)
			r.watchPidfd(e)
			continue
		}
		r.log.Info("pod's stager exited while kurmad was not running", "pod", rec.Pod.UUID)
		r.finish(ctx, e, "stager exited while kurmad was not running (exit status unknown)")
	}
	return nil
}

// waitPidfd waits until the process behind pidfd exits, ctx ends or limit
// passes; it reports whether the process exited.
func waitPidfd(ctx context.Context, pidfd int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 200)
		if err == nil && n > 0 {
			if fds[0].Revents&unix.POLLNVAL != 0 {
				return false // the pidfd was closed under us
			}
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
	}
}

// watchPidfd follows a stager that is not our child (re-adopted).
func (r *Runtime) watchPidfd(e *entry) {
	r.mu.Lock()
	fd := e.pidfd
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			if waitPidfd(r.closeCtx, fd, time.Hour) {
				break
			}
			r.mu.Lock()
			gone := e.pidfd != fd
			r.mu.Unlock()
			if r.closeCtx.Err() != nil || gone {
				return
			}
		}
		if r.isClosed() {
			return
		}
		r.onExit(e, "exit status unknown (re-adopted stager)", false, false)
	}()
}

// lookup finds a pod by UUID, name or unique UUID prefix.
func (r *Runtime) lookup(ref string) (*entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ref == "" {
		return nil, kerrors.New(kerrors.Invalid, "empty pod reference")
	}
	if e, ok := r.pods[ref]; ok {
		return e, nil
	}
	for _, e := range r.pods {
		if e.rec.Pod.Name == ref {
			return e, nil
		}
	}
	var found *entry
	for id, e := range r.pods {
		if strings.HasPrefix(id, ref) {
			if found != nil {
				return nil, kerrors.New(kerrors.Conflict, "pod reference %q is ambiguous", ref)
			}
			found = e
		}
	}
	if found == nil {
		return nil, kerrors.New(kerrors.NotFound, "pod %q not found", ref)
	}
	return found, nil
}
