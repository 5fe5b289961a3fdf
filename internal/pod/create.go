package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/internal/pod/stageinit"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// step is one stage of a pod start: do makes something, undo removes what
// do made (it must cope with a do that failed halfway).
type step struct {
	name string
	do   func(b *build, ctx context.Context) error
	undo func(b *build, ctx context.Context)
}

// build carries a pod through its start steps.
type build struct {
	r   *Runtime
	e   *entry
	dir string // <pods>/<uuid>

	stager   *image.Image
	stagerFS []image.Layer
	manifest stagerspec.Manifest
	layers   map[string]string // image ID -> host path
	imageIDs []string          // leased IDs
	volumes  map[string]string // volume name -> host source
	ro       map[string]bool
	proc     *launched
	// warm is the pre-started stager this pod took (prestart.go), if any.
	warm *warm
	// deadline bounds the stager's start and readiness together.
	deadline time.Time
}

// steps is the table of a pod start, in order. Rollback runs the undos of
// the steps done so far (including the failing one) in reverse.
var steps = []step{
	{"images", (*build).resolveImages, (*build).unleaseImages},
	{"dirs", (*build).makeDirs, (*build).removeDirs},
	{"rootfs", (*build).prepareRootfs, (*build).unprepareRootfs},
	{"manifest", (*build).writeManifest, nil},
	{"cgroups", (*build).makeCgroups, (*build).removeCgroups},
	{"launch", (*build).launch, (*build).kill},
	{"netns", (*build).bindNetNS, (*build).unbindNetNS},
	{"network", (*build).attachNetwork, (*build).detachNetwork},
	{"start", (*build).start, nil},
	{"ready", (*build).waitReady, nil},
}

// StepTotal is the name Options.ObserveStep gets for a whole pod start.
const StepTotal = "total"

// observe reports a start step (or StepTotal) that began at t0 to
// Options.ObserveStep.
func (r *Runtime) observe(step string, t0 time.Time, err error) {
	if r.opts.ObserveStep != nil {
		r.opts.ObserveStep(step, time.Since(t0), err)
	}
}

// StepNames lists the start steps in order (for failpoint tests).
func StepNames() []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.name
	}
	return out
}

// ValidName reports whether s may name a pod (podtypes.ValidName).
func ValidName(s string) bool { return podtypes.ValidName(s) }

// validateSpec checks a spec before anything is made: Spec.Validate (the
// one validator, which the API and CLI run too), then what only the host
// can tell (a host volume's source exists), and names the apps that have
// no name after their images.
func validateSpec(s *Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	for _, v := range s.Volumes {
		if v.Kind == "host" {
			if _, err := os.Stat(v.Source); err != nil {
				return kerrors.New(kerrors.Invalid, "host volume %q: %v", v.Name, err)
			}
		}
	}
	names := map[string]bool{}
	for _, a := range s.Apps {
		names[a.Name] = a.Name != ""
	}
	for i := range s.Apps {
		a := &s.Apps[i]
		if a.Name != "" {
			continue
		}
		a.Name = appNameFrom(a.Image)
		for n := 2; names[a.Name]; n++ {
			a.Name = fmt.Sprintf("%s-%d", appNameFrom(a.Image), n)
		}
		if !appc.ValidACName(a.Name) {
			return kerrors.New(kerrors.Invalid, "app %d: name %q derived from image %q is not valid; name the app", i, a.Name, a.Image)
		}
		names[a.Name] = true
	}
	return nil
}

// appNameFrom derives an AC name from an image reference.
func appNameFrom(ref string) string {
	s := ref
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	s = strings.TrimSuffix(s, "/")
	s = s[strings.LastIndex(s, "/")+1:]
	if i := strings.IndexAny(s, ":@"); i > 0 {
		s = s[:i]
	}
	s = strings.TrimSuffix(s, ".aci")
	s = strings.ToLower(s)
	var b strings.Builder
	for _, c := range s {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	n := strings.Trim(b.String(), "-")
	if n == "" || strings.HasPrefix(n, "sha512-") {
		return "app"
	}
	return n
}

// Create resolves the images, stages the pod and starts it, returning once
// the stager has signalled readiness. On failure every step done is undone.
func (r *Runtime) Create(ctx context.Context, spec Spec) (_ *Pod, retErr error) {
	spec = cloneSpec(spec)
	if err := validateSpec(&spec); err != nil {
		return nil, err
	}
	if r.opts.Network == nil {
		for _, n := range spec.Networks {
			if n != "host" && n != "none" {
				return nil, kerrors.New(kerrors.Invalid, "network %q: this kurmad has no pod networks configured", n)
			}
		}
	}
	defer r.busy()()
	// A pre-started stager brings the pod's UUID, folder, cgroups and
	// stager process along (prestart.go).
	w := r.takeWarm(&spec)
	var e *entry
	if w != nil {
		e = w.e
	} else {
		e = &entry{exited: make(chan struct{}), pidfd: -1}
		e.rec.Pod = Pod{UUID: uuid.NewString(), State: Creating}
	}
	id := e.rec.Pod.UUID
	if spec.Name == "" {
		spec.Name = "pod-" + id[:8]
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		if w != nil {
			r.undoWarm(context.WithoutCancel(ctx), w)
		}
		return nil, kerrors.New(kerrors.Unavailable, "pod manager is closed")
	}
	for _, o := range r.pods {
		if o.rec.Pod.Name == spec.Name {
			r.mu.Unlock()
			if w != nil {
				r.putBackWarm(w)
			}
			return nil, kerrors.New(kerrors.Conflict, "a pod named %q exists already (%s)", spec.Name, o.rec.Pod.UUID)
		}
	}
	e.rec.Pod.Name, e.rec.Pod.Spec, e.rec.Pod.Created = spec.Name, spec, time.Now().UTC()
	r.pods[id] = e
	r.mu.Unlock()

	b := &build{r: r, e: e, dir: r.podDir(id), warm: w}
	if w != nil {
		b.proc = w.p
	}
	done := 0
	defer func() {
		if retErr == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if b.warm != nil {
			// A pre-started stager brought its process, folder and
			// cgroups before any step: they go whatever step failed.
			b.kill(rctx)
		}
		for i := done - 1; i >= 0; i-- {
			if steps[i].undo != nil {
				steps[i].undo(b, rctx)
			}
		}
		if b.warm != nil {
			b.removeCgroups(rctx)
			b.removeDirs(rctx)
		}
		r.mu.Lock()
		delete(r.pods, id)
		r.mu.Unlock()
		r.log.Info("pod creation rolled back", "pod", id, "name", spec.Name, "err", retErr)
	}()
	total := time.Now()
	for _, s := range steps {
		t0 := time.Now()
		done++
		err := s.do(b, ctx)
		if err == nil && r.opts.FailStep == s.name {
			err = fmt.Errorf("failpoint after step %s", s.name)
		}
		r.observe(s.name, t0, err)
		if err != nil {
			r.log.Debug("pod start step failed", "pod", id, "step", s.name, "err", err)
			r.observe(StepTotal, total, err)
			return nil, fmt.Errorf("create pod %s: %w", spec.Name, err)
		}
		r.log.Debug("pod start step", "pod", id, "step", s.name, "took", time.Since(t0))
	}
	r.mu.Lock()
	e.rec.Pod.State = Running
	e.rec.Pod.Started = time.Now().UTC()
	r.mu.Unlock()
	// Not fsynced: the record must survive kurmad (the page cache does),
	// not the machine, whose crash ends the stager too. A running record
	// lost in one leaves a folder that recovery removes as debris.
	if err := r.save(e, false); err != nil {
		// The stager runs but its record could not be stored: a restart
		// would not find it, so undo everything.
		done = len(steps)
		r.observe(StepTotal, total, err)
		return nil, fmt.Errorf("create pod %s: %w", spec.Name, err)
	}
	r.observe(StepTotal, total, nil)
	b.proc.watch(r, e)
	r.log.Debug("pod started", "pod", id, "took", time.Since(total))
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.snapshot(), nil
}

// getImage finds a stored image by ID or reference, pulling it otherwise.
func (r *Runtime) getImage(ctx context.Context, ref string, opts image.PullOptions) (*image.Image, error) {
	if !opts.RequireSignature {
		if img, err := r.opts.Images.Get(ctx, ref); err == nil {
			return img, nil
		} else if !errors.Is(err, kerrors.NotFound) {
			return nil, err
		}
	}
	return r.opts.Images.Pull(ctx, ref, opts)
}

func (b *build) resolveImages(ctx context.Context) error {
	r := b.r
	spec := b.e.rec.Pod.Spec
	stagerRef := spec.StagerImage
	if stagerRef == "" {
		stagerRef = r.opts.StagerImage
	}
	if w := b.warm; w != nil {
		// Checked when it was pre-started (and leased since).
		b.stager, b.stagerFS = w.stager, w.stagerFS
	} else {
		st, fs, err := r.resolveStager(ctx, stagerRef)
		if err != nil {
			return err
		}
		b.stager, b.stagerFS = st, fs
	}
	st := b.stager
	b.imageIDs = []string{st.ID}
	b.layers = map[string]string{}
	m := stagerspec.Manifest{
		KurmaVersion:  r.opts.KurmaVersion,
		Name:          spec.Name,
		Images:        map[string]appc.ImageManifest{},
		AppImageOrder: map[string][]string{},
		StagerConfig:  r.opts.StagerConfig,
	}
	m.Pod = appc.PodManifest{ACKind: "PodManifest", ACVersion: "0.8.11", Volumes: spec.Volumes}
	apps := make([]AppInfo, 0, len(spec.Apps))
	for _, a := range spec.Apps {
		img, err := r.getImage(ctx, a.Image, image.PullOptions{})
		if err != nil {
			return fmt.Errorf("app %s: %w", a.Name, err) // the image store names the image
		}
		layers, err := r.opts.Images.Resolve(ctx, img.ID)
		if err != nil {
			return fmt.Errorf("app %s: resolve %s: %w", a.Name, a.Image, err)
		}
		order := make([]string, 0, len(layers))
		for _, l := range layers {
			order = append(order, l.ID)
			m.Images[l.ID] = l.Manifest
			b.layers[l.ID] = l.Path
		}
		m.Images[img.ID] = img.Manifest
		m.AppImageOrder[a.Name] = order
		m.Pod.Apps = append(m.Pod.Apps, appc.RuntimeApp{
			Name:   a.Name,
			Image:  appc.RuntimeImage{Name: img.Manifest.Name, ID: img.ID},
			App:    mergeApp(img.Manifest.App, a),
			Mounts: a.Mounts,
		})
		if a.TTY {
			// The stager gives such an app a terminal (docs/stager.md).
			last := &m.Pod.Apps[len(m.Pod.Apps)-1]
			last.Annotations = append(last.Annotations, appc.Annotation{Name: TTYAnnotation, Value: "true"})
			if sz := a.TTYSize; sz != nil && sz.Rows > 0 && sz.Cols > 0 {
				last.Annotations = append(last.Annotations, appc.Annotation{Name: TTYSizeAnnotation, Value: fmt.Sprintf("%dx%d", sz.Rows, sz.Cols)})
			}
		}
		if err := hostAccess(&m.Pod, spec, &a, &m.Pod.Apps[len(m.Pod.Apps)-1], img.Manifest); err != nil {
			return err
		}
		apps = append(apps, AppInfo{Name: a.Name, Image: a.Image, ImageID: img.ID})
		b.imageIDs = append(b.imageIDs, img.ID)
	}
	if err := hostAccess(&m.Pod, spec, nil, nil, appc.ImageManifest{}); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return kerrors.New(kerrors.Invalid, "stager manifest: %v", err)
	}
	for _, ra := range m.Pod.Apps {
		if ra.App == nil || len(ra.App.Exec) == 0 {
			return kerrors.New(kerrors.Invalid, "app %s has no exec: its image has none and none was given", ra.Name)
		}
	}
	b.manifest = m
	if err := r.opts.Images.Lease(ctx, b.e.rec.Pod.UUID, b.imageIDs...); err != nil {
		return fmt.Errorf("lease images: %w", err)
	}
	r.mu.Lock()
	b.e.rec.Pod.Apps = apps
	b.e.rec.Leased = true
	r.mu.Unlock()
	return nil
}

// mergeApp applies an AppSpec's overrides to the image's app.
func mergeApp(base *appc.App, a AppSpec) *appc.App {
	var out appc.App
	if base != nil {
		out = *base
		out.Exec = append([]string(nil), base.Exec...)
		out.Environment = append([]appc.EnvVar(nil), base.Environment...)
	}
	if len(a.Exec) > 0 {
		out.Exec = append([]string(nil), a.Exec...)
	}
	for _, e := range a.Env {
		replaced := false
		for i := range out.Environment {
			if out.Environment[i].Name == e.Name {
				out.Environment[i].Value, replaced = e.Value, true
			}
		}
		if !replaced {
			out.Environment = append(out.Environment, e)
		}
	}
	if a.User != "" {
		out.User = a.User
	}
	if a.Group != "" {
		out.Group = a.Group
	}
	if out.User == "" {
		out.User = "0"
	}
	if out.Group == "" {
		out.Group = "0"
	}
	if a.WorkingDirectory != "" {
		out.WorkingDirectory = a.WorkingDirectory
	}
	return &out
}

func (b *build) unleaseImages(ctx context.Context) {
	if err := b.r.opts.Images.Unlease(ctx, b.e.rec.Pod.UUID); err != nil {
		b.r.log.Warn("unlease images", "pod", b.e.rec.Pod.UUID, "err", err)
	}
}

func (b *build) makeDirs(ctx context.Context) error {
	if b.warm == nil {
		if err := os.Mkdir(b.dir, 0o700); err != nil {
			return fmt.Errorf("create pod dir: %w", err)
		}
	}
	spec := b.e.rec.Pod.Spec
	b.volumes = map[string]string{}
	b.ro = map[string]bool{}
	volDir := filepath.Join(b.r.opts.VolumesDir, b.e.rec.Pod.UUID)
	for _, v := range spec.Volumes {
		src := v.Source
		if v.Kind == "empty" {
			src = filepath.Join(volDir, v.Name)
			if err := os.MkdirAll(src, 0o755); err != nil {
				return fmt.Errorf("create volume %s: %w", v.Name, err)
			}
			b.r.mu.Lock()
			b.e.rec.Volumes = volDir
			b.r.mu.Unlock()
		}
		b.volumes[v.Name] = src
		b.ro[v.Name] = v.ReadOnly != nil && *v.ReadOnly
	}
	// A record from now on: a daemon that dies mid-create rolls it back on
	// restart. Not synced: losing it only leaves a folder that the restart
	// removes as debris. A pre-started stager's record exists already;
	// it needs saving again only to name the empty volumes' folder.
	if b.warm != nil && b.e.rec.Volumes == "" {
		return nil
	}
	return b.r.save(b.e, false)
}

func (b *build) removeDirs(ctx context.Context) {
	if err := b.r.removeFiles(ctx, b.e); err != nil {
		b.r.log.Warn("remove pod files", "pod", b.e.rec.Pod.UUID, "err", err)
	}
}

// removeFiles deletes a pod's folder (after detaching anything still
// mounted under it) and its empty volumes. The folder is renamed into the
// trash at once and deleted in the background (see trash.go).
func (r *Runtime) removeFiles(ctx context.Context, e *entry) error {
	dir := r.podDir(e.rec.Pod.UUID)
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if err := r.discard(dir); err != nil {
		return fmt.Errorf("remove pod dir: %w", err)
	}
	if e.rec.Volumes != "" {
		if err := os.RemoveAll(e.rec.Volumes); err != nil {
			return fmt.Errorf("remove pod volumes: %w", err)
		}
	}
	return nil
}

func (b *build) stagerRoot() string { return filepath.Join(b.dir, "stager") }

// prepareRootfs gives the pod its own writable view of the stager's root
// (see prepareStagerRoot): an overlay over the store's extracted stager
// rootfs, extracted once per image ID and shared, or a copy.
func (b *build) prepareRootfs(ctx context.Context) error {
	if b.warm != nil {
		return nil // mounted when it was pre-started
	}
	return prepareStagerRoot(ctx, b.stagerFS[0].Path, b.dir, b.r.copyRoot)
}

func (b *build) unprepareRootfs(ctx context.Context) {
	if err := unmountUnder(b.stagerRoot()); err != nil {
		b.r.log.Warn("unmount stager root", "pod", b.e.rec.Pod.UUID, "err", err)
	}
}

// overlay is the stager root's overlay that stage-init mounts, nil in
// copy mode and for a pre-started stager (mounted on the host).
func (b *build) overlay() *stageinit.Overlay {
	if b.r.copyRoot || b.warm != nil {
		return nil
	}
	return &stageinit.Overlay{
		Lower: b.stagerFS[0].Path,
		Upper: filepath.Join(b.dir, "stager.upper"),
		Work:  filepath.Join(b.dir, "stager.work"),
	}
}

// writeRoot is where files for the stager's root are written: the
// overlay's upper folder before stage-init mounts it, or the root itself
// (copied, or mounted on the host for a pre-started stager).
func (b *build) writeRoot() string {
	if o := b.overlay(); o != nil {
		return o.Upper
	}
	return b.stagerRoot()
}

func (b *build) writeManifest(ctx context.Context) error {
	data, err := json.MarshalIndent(&b.manifest, "", "  ")
	if err != nil {
		return fmt.Errorf("encode stager manifest: %w", err)
	}
	root := b.writeRoot()
	if err := os.WriteFile(filepath.Join(root, "manifest"), data, 0o644); err != nil {
		return fmt.Errorf("write stager manifest: %w", err)
	}
	if b.warm != nil {
		return nil
	}
	return makeRootDirs(root)
}

// makeRootDirs makes the mount points of the stager spec in a stager root.
func makeRootDirs(root string) error {
	for _, d := range []string{"layers", "volumes", "dev", "proc", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("create /%s in stager root: %w", d, err)
		}
	}
	return nil
}

func (b *build) makeCgroups(ctx context.Context) error {
	if b.warm != nil {
		return nil // made when it was pre-started
	}
	made, err := b.r.makeCgroups(b.e.rec.Pod.UUID)
	b.r.mu.Lock()
	b.e.rec.Cgroups = made
	b.r.mu.Unlock()
	return err
}

func (b *build) removeCgroups(ctx context.Context) {
	if err := removeCgroups(b.e.rec.Cgroups); err != nil {
		b.r.log.Warn("remove cgroups", "pod", b.e.rec.Pod.UUID, "err", err)
	}
}
