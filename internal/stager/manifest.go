package stager

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// Paths the stager owns inside its root.
const (
	AppsDir    = "/apps"
	LogsDir    = "/logs"
	StatePath  = "/state.json"
	RunDir     = "/run/kurma-stager"
	SocketPath = "/run/kurma-stager/init.sock"
)

// DefaultGrace is how long apps get between SIGTERM and SIGKILL.
const DefaultGrace = 10 * time.Second

// DefaultPath is the PATH an app gets when neither image nor pod sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxManifestSize bounds what ParseManifest accepts.
const maxManifestSize = 16 << 20

// Config is this stager's part of the manifest (stagerConfig).
type Config struct {
	// Union is "overlay", "copy" or "" (overlay, falling back to copy).
	Union string `json:"union,omitempty"`
	// FS is accepted as another name for Union.
	FS string `json:"fs,omitempty"`
	// GracePeriod is a Go duration ("10s") between TERM and KILL.
	GracePeriod string `json:"gracePeriod,omitempty"`
	// LogMaxBytes is the size at which an app's log is rotated (one old
	// generation is kept); 0 means DefaultLogMaxBytes.
	LogMaxBytes int64 `json:"logMaxBytes,omitempty"`
}

// Grace returns the configured grace period or DefaultGrace.
func (c Config) Grace() time.Duration {
	if d, err := time.ParseDuration(c.GracePeriod); err == nil && d >= 0 {
		return d
	}
	return DefaultGrace
}

// ParseManifest decodes and validates a stager manifest and this stager's
// config from it.
func ParseManifest(b []byte) (*stagerspec.Manifest, Config, error) {
	var cfg Config
	if len(b) > maxManifestSize {
		return nil, cfg, kerrors.New(kerrors.Invalid, "manifest larger than %d bytes", maxManifestSize)
	}
	var m stagerspec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, cfg, kerrors.New(kerrors.Invalid, "decode manifest: %v", err)
	}
	if err := m.Validate(); err != nil {
		return nil, cfg, fmt.Errorf("%w: manifest: %w", kerrors.Invalid, err)
	}
	if len(m.StagerConfig) > 0 && string(m.StagerConfig) != "null" {
		if err := json.Unmarshal(m.StagerConfig, &cfg); err != nil {
			return nil, cfg, kerrors.New(kerrors.Invalid, "stagerConfig: %v", err)
		}
	}
	if cfg.Union == "" {
		cfg.Union = cfg.FS
	}
	switch cfg.Union {
	case "", "overlay", "copy":
	default:
		return nil, cfg, kerrors.New(kerrors.Invalid, "stagerConfig: unknown union %q", cfg.Union)
	}
	if cfg.GracePeriod != "" {
		if d, err := time.ParseDuration(cfg.GracePeriod); err != nil || d < 0 {
			return nil, cfg, kerrors.New(kerrors.Invalid, "stagerConfig: bad gracePeriod %q", cfg.GracePeriod)
		}
	}
	if cfg.LogMaxBytes != 0 && cfg.LogMaxBytes < MinLogMaxBytes {
		return nil, cfg, kerrors.New(kerrors.Invalid, "stagerConfig: logMaxBytes %d below %d", cfg.LogMaxBytes, MinLogMaxBytes)
	}
	for _, a := range m.Pod.Apps {
		if a.Name == "init" {
			// "init" is the name of the pod init's log.
			return nil, cfg, kerrors.New(kerrors.Invalid, "app name %q is reserved", a.Name)
		}
	}
	return &m, cfg, nil
}

// ParseRunSettings decodes and validates the JSON /opt/stager/run reads.
func ParseRunSettings(b []byte) (*stagerspec.RunSettings, error) {
	var s stagerspec.RunSettings
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&s); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "decode run settings: %v", err)
	}
	if dec.More() {
		return nil, kerrors.New(kerrors.Invalid, "trailing data after run settings")
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%w: run settings: %w", kerrors.Invalid, err)
	}
	for _, g := range s.SupplementaryGIDs {
		if g < 0 || int64(g) > 0xFFFFFFFE {
			return nil, kerrors.New(kerrors.Invalid, "supplementary GID %d out of range", g)
		}
	}
	if s.WorkingDirectory != "" && !strings.HasPrefix(s.WorkingDirectory, "/") {
		return nil, kerrors.New(kerrors.Invalid, "workingDirectory %q is not absolute", s.WorkingDirectory)
	}
	return &s, nil
}

// AppPlan is everything init needs to start one app.
type AppPlan struct {
	Name   string   `json:"name"`
	Rootfs string   `json:"rootfs"`
	Exec   []string `json:"exec"`
	Env    []string `json:"env"`
	Dir    string   `json:"dir"`
	ID     Identity `json:"id"`
	// TTY gives the app a terminal instead of pipes (TTYAnnotation).
	TTY bool `json:"tty,omitempty"`
	// Rows and Cols are the terminal's size at start (TTYSizeAnnotation).
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Priv bounds the capabilities of the app's processes (caps.go).
	Priv Privileges `json:"priv"`
	// Stdin is what the app's main reads on stdin before EOF
	// (stagerspec.StdinAnnotation); nil keeps stdin open for attach.
	Stdin []byte `json:"stdin,omitempty"`
	// ProcSysRW leaves the app's /proc/sys writable
	// (stagerspec.HostPrivilegedAnnotation).
	ProcSysRW bool `json:"procSysRW,omitempty"`
}

// TTYAnnotation on a pod app ("true") gives the app a terminal as its
// stdin, stdout and stderr; attach then talks to that terminal.
const TTYAnnotation = "kurma.dev/tty"

// TTYSizeAnnotation ("ROWSxCOLS", e.g. "24x80") is the size an app's
// terminal has when it starts, so that the app sees its user's size
// before anyone attaches. A malformed value is ignored.
const TTYSizeAnnotation = "kurma.dev/tty-size"

// ttySize returns the size asked by TTYSizeAnnotation, zeros if none.
func ttySize(ra appc.RuntimeApp) (rows, cols uint16) {
	for _, a := range ra.Annotations {
		if a.Name != TTYSizeAnnotation {
			continue
		}
		r, c, ok := strings.Cut(a.Value, "x")
		rv, err1 := strconv.ParseUint(r, 10, 16)
		cv, err2 := strconv.ParseUint(c, 10, 16)
		if ok && err1 == nil && err2 == nil {
			return uint16(rv), uint16(cv)
		}
	}
	return 0, 0
}

func wantsTTY(ra appc.RuntimeApp) bool {
	for _, a := range ra.Annotations {
		if a.Name == TTYAnnotation {
			return a.Value == "true"
		}
	}
	return false
}

// appDefinition merges the image's App with the pod's override: the pod's
// App replaces the image's, but empty exec, user and group fall back to the
// image's values.
func appDefinition(m *stagerspec.Manifest, ra appc.RuntimeApp) (appc.App, error) {
	var img *appc.App
	if im, ok := m.Images[ra.Image.ID]; ok && im.App != nil {
		img = im.App
	}
	if img == nil {
		for _, id := range m.AppImageOrder[ra.Name] {
			if im := m.Images[id]; im.App != nil {
				img = im.App
				break
			}
		}
	}
	var out appc.App
	switch {
	case ra.App != nil:
		out = *ra.App
		if img != nil {
			if len(out.Exec) == 0 {
				out.Exec = img.Exec
			}
			if out.User == "" {
				out.User = img.User
			}
			if out.Group == "" {
				out.Group = img.Group
			}
		}
	case img != nil:
		out = *img
	}
	if len(out.Exec) == 0 {
		return out, kerrors.New(kerrors.Invalid, "app %q has no exec", ra.Name)
	}
	if out.User == "" {
		out.User = "0"
	}
	if out.Group == "" {
		out.Group = "0"
	}
	return out, nil
}

// BuildEnv returns the environment of a process in an app: the defaults
// (PATH, HOME, AC_APP_NAME, TERM with a tty) overridden by vars in order.
func BuildEnv(app string, id Identity, tty bool, vars ...[]appc.EnvVar) []string {
	keys := []string{}
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	set("PATH", DefaultPath)
	set("HOME", id.Home)
	set("AC_APP_NAME", app)
	if tty {
		set("TERM", "xterm")
	}
	for _, list := range vars {
		for _, e := range list {
			set(e.Name, e.Value)
		}
	}
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+vals[k])
	}
	return env
}

// lookPath resolves a command name against PATH inside rootfs; absolute
// names are returned as they are.
func lookPath(rootfs, name string, env []string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return name, nil
	}
	if strings.Contains(name, "/") {
		return "", kerrors.New(kerrors.Invalid, "exec %q must be absolute or a bare name", name)
	}
	pathVar := DefaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if !strings.HasPrefix(dir, "/") {
			continue
		}
		p := path.Join(dir, name)
		host, err := SecureJoin(rootfs, p)
		if err != nil {
			continue
		}
		if fi, err := os.Stat(host); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", kerrors.New(kerrors.NotFound, "executable %q not found in PATH", name)
}

// planApp resolves an app's process settings against its built rootfs.
func planApp(m *stagerspec.Manifest, ra appc.RuntimeApp, rootfs string) (AppPlan, error) {
	def, err := appDefinition(m, ra)
	if err != nil {
		return AppPlan{}, err
	}
	id, err := ResolveIdentity(rootfs, def.User, def.Group, def.SupplementaryGIDs)
	if err != nil {
		return AppPlan{}, fmt.Errorf("app %q: %w", ra.Name, err)
	}
	tty := wantsTTY(ra)
	env := BuildEnv(ra.Name, id, tty, def.Environment)
	exe, err := lookPath(rootfs, def.Exec[0], env)
	if err != nil {
		return AppPlan{}, fmt.Errorf("app %q: %w", ra.Name, err)
	}
	dir := def.WorkingDirectory
	if dir == "" {
		dir = "/"
	}
	priv, err := appPrivileges(def.Isolators)
	if err != nil {
		return AppPlan{}, fmt.Errorf("app %q: %w", ra.Name, err)
	}
	argv := append([]string{exe}, def.Exec[1:]...)
	plan := AppPlan{Name: ra.Name, Rootfs: rootfs, Exec: argv, Env: env, Dir: dir, ID: id, TTY: tty, Priv: priv}
	if plan.Stdin, err = appStdin(ra); err != nil {
		return AppPlan{}, err
	}
	if plan.Stdin != nil && tty {
		return AppPlan{}, kerrors.New(kerrors.Invalid, "app %q: %s and a terminal exclude each other", ra.Name, stagerspec.StdinAnnotation)
	}
	plan.ProcSysRW = appAnnotation(ra, stagerspec.HostPrivilegedAnnotation) == "true"
	if tty {
		plan.Rows, plan.Cols = ttySize(ra)
	}
	return plan, nil
}

// PlanRun resolves run settings for a process in app's rootfs.
func PlanRun(app, rootfs string, s *stagerspec.RunSettings) (AppPlan, error) {
	id, err := ResolveIdentity(rootfs, s.User, s.Group, s.SupplementaryGIDs)
	if err != nil {
		return AppPlan{}, err
	}
	env := BuildEnv(app, id, s.TTY, s.Environment)
	exe, err := lookPath(rootfs, s.Exec[0], env)
	if err != nil {
		return AppPlan{}, err
	}
	dir := s.WorkingDirectory
	if dir == "" {
		dir = "/"
	}
	return AppPlan{Name: app, Rootfs: rootfs, Exec: append([]string{exe}, s.Exec[1:]...), Env: env, Dir: dir, ID: id}, nil
}

// AppRootfs is where an app's root filesystem is assembled.
func AppRootfs(app string) string { return filepath.Join(AppsDir, app, "rootfs") }
