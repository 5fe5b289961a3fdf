package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	image "kurma.dev/kurma/internal/image/imagetypes"
)

// Networker attaches a pod's network namespace to its networks. The
// networking issue supplies one; nil means the pod only gets the loopback
// (or the host's namespace for Spec.Networks == ["host"]). Attach runs after
// the namespace exists and before the stager starts its apps; Detach must be
// idempotent (a missing namespace or interface is success).
type Networker interface {
	Attach(ctx context.Context, p *Pod) ([]json.RawMessage, error)
	Detach(ctx context.Context, p *Pod) error
}

// Options configures a Runtime.
type Options struct {
	// PodsDir holds <uuid>/ per pod; VolumesDir the pods' empty volumes.
	PodsDir    string
	VolumesDir string
	// Images is the image store (required).
	Images image.Store
	// StagerImage is the default stager image URI or reference (required).
	StagerImage string
	// StagerConfig is passed untouched into each stager manifest.
	StagerConfig json.RawMessage
	// ReadyTimeout bounds the wait for the stager's readiness (default 60s).
	ReadyTimeout time.Duration
	// KurmaVersion goes into the stager manifest.
	KurmaVersion string
	// Executable is the binary started as `<exe> stage-init CONFIG`, which
	// must run stageinit.Main. Default: kurma-stage-init beside this
	// program's executable, else this program itself (kurmad dispatches
	// stage-init first thing).
	Executable string
	// Nsenter is the nsenter binary used for call-ins (default: looked up
	// in PATH).
	Nsenter string
	// CgroupRoot is the folder under each cgroup hierarchy where pod
	// cgroups are made (default "kurma").
	CgroupRoot string
	// CopyStagerRoot copies the stager rootfs into each pod instead of
	// mounting an overlay over the shared extracted copy (the fallback
	// kurmad also takes by itself when overlayfs is unavailable).
	CopyStagerRoot bool
	// NoSpare turns off the warm spare stage-init (spare.go) and the
	// pre-started stager (prestart.go): every pod start then forks its own.
	NoSpare bool
	// NoPrestart keeps a bare stage-init as the spare even when the
	// default stager image may be pre-started.
	NoPrestart bool
	// Network attaches pods to their networks; nil: loopback only.
	Network Networker
	// Logger receives step timings at debug level (default slog.Default()).
	Logger *slog.Logger
	// ObserveStep, when set, is told how long each start step took (by
	// the names StepNames lists, and StepTotal for the whole start) and
	// whether it failed: kurmad's metrics.
	ObserveStep func(step string, took time.Duration, err error) `json:"-"`
	// FailStep makes Create fail right after the named start step has done
	// its work (tests of the rollback; see steps in create.go).
	FailStep string
}

// Runtime is kurmad's pod manager: the concrete pod.Manager.
//
// Locking: mu guards pods, byName and every field of every entry's rec
// and state flags; it is never held across a blocking call (I/O with a
// stager, waits, mounts). Per-pod operations serialise on entry.op.
type Runtime struct {
	opts    Options
	log     *slog.Logger
	cgroups []cgroupMount

	// closeCtx ends the watchers of adopted pods when the Runtime closes.
	closeCtx    context.Context
	closeCancel context.CancelFunc
	wg          sync.WaitGroup

	// cgMu serialises the making of cgroup folders (shared parents).
	cgMu sync.Mutex

	// copyRoot: copy the stager rootfs per pod (no overlayfs here).
	copyRoot bool

	// spareMu guards spare (the warm stage-init, spare.go), warm (the
	// pre-started stager, prestart.go), spareBusy (one is being started),
	// ops (pod operations in flight) and idle (the timer of the next).
	spareMu   sync.Mutex
	spare     *launched
	warm      *warm
	spareBusy bool
	ops       int
	idle      *time.Timer

	mu     sync.Mutex
	closed bool
	pods   map[string]*entry // by UUID
}

var _ Manager = (*Runtime)(nil)

// New opens the pod manager on opts.PodsDir, re-adopting the pods a previous
// kurmad left running (their stager is checked to be the same process by its
// start time) and cleaning up those whose stager died meanwhile or whose
// creation was interrupted.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.Images == nil {
		return nil, errors.New("pod.New: Options.Images is required")
	}
	if opts.StagerImage == "" {
		return nil, errors.New("pod.New: Options.StagerImage is required")
	}
	for _, d := range []*string{&opts.PodsDir, &opts.VolumesDir} {
		if *d == "" || !filepath.IsAbs(*d) {
			return nil, fmt.Errorf("pod.New: pods and volumes dirs must be absolute paths (got %q)", *d)
		}
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.KurmaVersion == "" {
		opts.KurmaVersion = "0.1.0"
	}
	if opts.CgroupRoot == "" {
		opts.CgroupRoot = "kurma"
	}
	if opts.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		opts.Executable = exe
		if helper := filepath.Join(filepath.Dir(exe), StageInitBinary); isExecutable(helper) {
			opts.Executable = helper
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	for _, d := range []string{opts.PodsDir, opts.VolumesDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	cgs, err := findCgroupMounts()
	if err != nil {
		return nil, err
	}
	r := &Runtime{
		opts:    opts,
		log:     opts.Logger,
		cgroups: cgs,
		pods:    map[string]*entry{},
	}
	r.copyRoot = opts.CopyStagerRoot || !overlayWorks(opts.PodsDir)
	if r.copyRoot && !opts.CopyStagerRoot {
		r.log.Warn("overlayfs unavailable under the pods dir; stager roots will be copied", "dir", opts.PodsDir)
	}
	r.closeCtx, r.closeCancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := r.emptyTrash(); err != nil {
		r.closeCancel()
		return nil, err
	}
	if err := r.recover(ctx); err != nil {
		r.closeCancel()
		return nil, err
	}
	if !opts.NoSpare {
		r.refillSpare()
		r.wg.Add(1)
		go r.watchMounts()
	}
	return r, nil
}

// Close stops watching the pods without stopping them: a new Runtime on the
// same directories re-adopts them.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.closeCancel()
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range r.pods {
			if e.pidfd >= 0 {
				unix.Close(e.pidfd)
				e.pidfd = -1
			}
		}
	}()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		r.dropSpare(ctx)
		// The background deletions are done: leave no empty trash behind,
		// nor empty cgroup parents.
		_ = os.Remove(r.trashPath())
		r.removeEmptyCgroupRoots()
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close pod manager: %w", ctx.Err())
	}
}

// startWork counts a background task that Close must wait for (the
// caller runs r.wg.Done when it ends); it reports false, counting
// nothing, once the Runtime is closed.
func (r *Runtime) startWork() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	return true
}

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

func (r *Runtime) podDir(uuid string) string { return filepath.Join(r.opts.PodsDir, uuid) }

// StageInitBinary is the name of the stage-init program that kurmad looks
// for beside its own executable (cmd/kurma-stage-init).
const StageInitBinary = "kurma-stage-init"

// isExecutable reports whether path is a regular file someone may execute.
func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
