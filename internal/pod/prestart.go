package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// A pre-started stager (docs/stager.md, "Pre-started stagers"): when the
// default stager image declares stagerspec.PrestartAnnotation, the warm
// spare is not a bare stage-init but a whole pod in waiting: its UUID,
// folder, cgroups and namespaces are made, and the stager runs in them,
// its Go runtime started, waiting for the go-ahead. A pod start that takes
// it only adds what is the pod's own, then says go:
//
//   - the stager root is an overlay mounted on the host at <dir>/stager
//     and shared; the stager's copy of it is a slave, so the manifest that
//     the daemon writes there and the binds it makes under it (/layers,
//     /volumes) reach the stager, and nothing flows back;
//   - the binds are made read-only (and private, or slaves for
//     VolumePropagation) before they are attached (open_tree,
//     mount_setattr, move_mount), since a remount would not propagate;
//   - the stager sets the pod's hostname itself.
//
// Its record (state Creating, no name) is on disk from the start, so a
// daemon that dies leaves nothing that the restart does not roll back like
// any interrupted create. Pods that use another stager image, the host's
// network or its IPC/UTS namespaces start the usual way.

// warm is a pre-started stager with the pod entry it will become.
type warm struct {
	e        *entry
	p        *launched
	stager   *image.Image
	stagerFS []image.Layer
}

// errNoPrestart: the default stager image does not declare it may be
// pre-started.
var errNoPrestart = errors.New("stager image does not declare pre-start")

// warmFits reports whether a pod with spec may take the pre-started
// stager.
func (r *Runtime) warmFits(spec *Spec) bool {
	if spec.StagerImage != "" && spec.StagerImage != r.opts.StagerImage {
		return false
	}
	if len(spec.Networks) == 1 && spec.Networks[0] == "host" {
		return false
	}
	return len(hostShared(*spec)) == 0
}

// takeWarm returns the pre-started stager, if any, for a pod with spec.
func (r *Runtime) takeWarm(spec *Spec) *warm {
	if !r.warmFits(spec) {
		return nil
	}
	r.spareMu.Lock()
	w := r.warm
	r.warm = nil
	r.spareMu.Unlock()
	if w != nil {
		select {
		case <-w.p.waited:
			// Died while waiting: no use. Its undo runs in the background.
			r.discardWarm(w)
			return nil
		default:
		}
	}
	return w
}

// putBackWarm returns an untouched pre-started stager (a create refused
// before using it).
func (r *Runtime) putBackWarm(w *warm) {
	closed := r.isClosed()
	r.spareMu.Lock()
	if r.warm == nil && !closed {
		r.warm = w
		w = nil
	}
	r.spareMu.Unlock()
	if w != nil {
		r.discardWarm(w)
	}
}

// discardWarm undoes a pre-started stager in the background.
func (r *Runtime) discardWarm(w *warm) {
	if !r.startWork() {
		r.undoWarm(context.Background(), w)
		return
	}
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r.undoWarm(ctx, w)
	}()
}

// resolveStager finds (pulling it if need be) a stager image, checks that
// it is signed by a trusted key and self-contained, and resolves its one
// root filesystem.
func (r *Runtime) resolveStager(ctx context.Context, ref string) (*image.Image, []image.Layer, error) {
	st, err := r.getImage(ctx, ref, image.PullOptions{RequireSignature: true})
	if err != nil {
		return nil, nil, fmt.Errorf("stager: %w", err) // the image layer names ref
	}
	if len(st.Manifest.Dependencies) > 0 {
		return nil, nil, kerrors.New(kerrors.Unauthorized, "stager image %s has dependencies; a stager must be self-contained", ref)
	}
	if st.Manifest.App == nil || len(st.Manifest.App.Exec) == 0 {
		return nil, nil, kerrors.New(kerrors.Invalid, "stager image %s has no exec", ref)
	}
	fs, err := r.opts.Images.Resolve(ctx, st.ID)
	if err != nil {
		return nil, nil, fmt.Errorf("stager image %s: %w", ref, err)
	}
	if len(fs) != 1 {
		return nil, nil, kerrors.New(kerrors.Invalid, "stager image %s must be exactly one root filesystem, has %d", ref, len(fs))
	}
	return st, fs, nil
}

// prestartable reports whether a stager image declares it may be
// pre-started.
func prestartable(m *image.Image) bool {
	for _, a := range m.Manifest.Annotations {
		if a.Name == stagerspec.PrestartAnnotation {
			return a.Value == "true"
		}
	}
	return false
}

// makeWarm starts a pre-started stager of the default stager image, or
// returns errNoPrestart when that image does not declare it may be.
func (r *Runtime) makeWarm(ctx context.Context) (_ *warm, retErr error) {
	if r.copyRoot || r.opts.NoPrestart {
		return nil, errNoPrestart
	}
	st, fs, err := r.resolveStager(ctx, r.opts.StagerImage)
	if err != nil {
		return nil, err
	}
	if !prestartable(st) {
		return nil, errNoPrestart
	}
	id := uuid.NewString()
	e := &entry{exited: make(chan struct{}), pidfd: -1}
	e.rec.Pod = Pod{UUID: id, State: Creating, Created: time.Now().UTC()}
	w := &warm{e: e, stager: st, stagerFS: fs}
	defer func() {
		if retErr != nil {
			r.undoWarm(context.WithoutCancel(ctx), w)
		}
	}()
	if err := r.opts.Images.Lease(ctx, id, st.ID); err != nil {
		return nil, fmt.Errorf("lease stager image: %w", err)
	}
	e.rec.Leased = true
	dir := r.podDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pod dir: %w", err)
	}
	// From here on the record lets a restart roll it back.
	if err := r.save(e, false); err != nil {
		return nil, err
	}
	if err := prepareStagerRoot(ctx, fs[0].Path, dir, false); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "stager")
	opts := "lowerdir=" + fs[0].Path + ",upperdir=" + filepath.Join(dir, "stager.upper") + ",workdir=" + filepath.Join(dir, "stager.work")
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("mount stager root overlay: %w", err)
	}
	if err := unix.Mount("", root, "", unix.MS_SHARED, ""); err != nil {
		return nil, fmt.Errorf("make stager root shared: %w", err)
	}
	if err := makeRootDirs(root); err != nil {
		return nil, err
	}
	cgs, err := r.makeCgroups(id)
	r.mu.Lock()
	e.rec.Cgroups = cgs
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := r.save(e, false); err != nil {
		return nil, err
	}
	c := stageinit.Config{Root: root, Prestart: true, Exec: st.Manifest.App.Exec, Env: stagerEnv(st)}
	c.Cgroups, c.CgroupV2Only = stagerCgroups(r.cgroups, cgs)
	arg, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("encode stage-init config: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "stager.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open stager log: %w", err)
	}
	p, err := r.spawn(string(arg), logf, false)
	if err != nil {
		logf.Close()
		return nil, err
	}
	p.log = logf
	w.p = p
	if err := r.adopt(e, p); err != nil {
		return nil, err
	}
	if err := joinCgroups(cgs, p.cmd.Process.Pid); err != nil {
		return nil, err
	}
	if err := r.save(e, false); err != nil {
		return nil, err
	}
	// stage-init execs the stager at once: its status descriptor reads EOF
	// then, or the reason it could not.
	if err := p.execDone(ctx, time.Now().Add(r.opts.ReadyTimeout)); err != nil {
		return nil, err
	}
	return w, nil
}

// undoWarm removes what makeWarm made (of a pre-started stager no pod took).
func (r *Runtime) undoWarm(ctx context.Context, w *warm) {
	if w.p != nil {
		w.p.abandon()
	}
	r.closePidfd(w.e)
	id := w.e.rec.Pod.UUID
	if err := removeCgroups(w.e.rec.Cgroups); err != nil {
		r.log.Warn("remove cgroups of a pre-started stager", "pod", id, "err", err)
	}
	if err := r.removeFiles(ctx, w.e); err != nil {
		r.log.Warn("remove a pre-started stager", "pod", id, "err", err)
	}
	if w.e.rec.Leased {
		if err := r.opts.Images.Unlease(ctx, id); err != nil {
			r.log.Warn("unlease a pre-started stager's image", "pod", id, "err", err)
		}
	}
}

// adopt records p as the stager of e: its pid, start time and a pidfd.
func (r *Runtime) adopt(e *entry, p *launched) error {
	pid := p.cmd.Process.Pid
	st, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("stager %d: %w", pid, err)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of stager: %w", err)
	}
	r.mu.Lock()
	e.pidfd = fd
	e.rec.Pod.StagerPID = pid
	e.rec.StagerStart = st
	r.mu.Unlock()
	return nil
}

// execDone waits, until deadline, for stage-init to exec the stager:
// its status descriptor is close-on-exec, so EOF without a message means
// it did.
func (p *launched) execDone(ctx context.Context, deadline time.Time) error {
	type res struct {
		msg []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := io.ReadAll(io.LimitReader(p.statR, 64*1024))
		ch <- res{m, err}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case x := <-ch:
		if x.err != nil {
			return fmt.Errorf("read stage-init status: %w", x.err)
		}
		if len(x.msg) > 0 {
			return errors.New(strings.TrimSpace(string(x.msg)))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stager launch: %w", ctx.Err())
	case <-timer.C:
		return kerrors.New(kerrors.Timeout, "stager was not started within %v (stage-init hung)", time.Until(deadline))
	}
}

// attachWarm adds the pod's own files to a pre-started stager's root:
// the layers and volumes, bound on the host under the shared root.
func (b *build) attachWarm(ctx context.Context) error {
	root := b.stagerRoot()
	slave := b.e.rec.Pod.Spec.VolumePropagation
	for id, p := range b.layers {
		if err := attachBind(p, filepath.Join(root, stagerspec.LayersDir, id), true, false, false); err != nil {
			return err
		}
	}
	for name, src := range b.volumes {
		if err := attachBind(src, filepath.Join(root, stagerspec.VolumesDir, name), b.ro[name], slave, slave); err != nil {
			return err
		}
	}
	return nil
}

// attachBind binds src on target (made as a folder or file to match) with
// its attributes set before it is attached, so that the copy propagated
// to the stager gets them too: read-only when ro, recursive and a slave
// of src's mounts when slave (later mounts under src then reach the pod),
// private otherwise.
func attachBind(src, target string, ro, rec, slave bool) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("bind source: %w", err)
	}
	if err := makeMountPoint(target, st.IsDir()); err != nil {
		return err
	}
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	attrFlags := unix.AT_EMPTY_PATH
	if rec {
		flags |= unix.AT_RECURSIVE
		attrFlags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, uint(flags))
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Propagation: unix.MS_PRIVATE}
	if slave {
		attr.Propagation = unix.MS_SLAVE
	}
	if ro {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", uint(attrFlags), &attr); err != nil {
		return fmt.Errorf("set attributes of the bind of %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, target, err)
	}
	return nil
}

// makeMountPoint creates target as a folder, or as an empty file.
func makeMountPoint(target string, dir bool) error {
	var err error
	if dir {
		err = os.MkdirAll(target, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	return nil
}

// goAhead tells a pre-started stager that its pod's files are in place.
func (p *launched) goAhead() error {
	_, err := p.goW.Write([]byte{1})
	p.goW.Close()
	p.goW = nil
	if err != nil {
		return fmt.Errorf("go-ahead to the pre-started stager: %w", err)
	}
	return nil
}
