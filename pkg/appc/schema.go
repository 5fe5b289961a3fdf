package appc

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Schema versions Kurma writes.
const (
	ACVersion         = "0.8.11"
	KindImageManifest = "ImageManifest"
	KindPodManifest   = "PodManifest"
)

// ImageManifest is the appc image manifest (aci.md, "Image Manifest Schema").
type ImageManifest struct {
	ACKind        string       `json:"acKind"`
	ACVersion     string       `json:"acVersion"`
	Name          string       `json:"name"`
	Labels        []Label      `json:"labels,omitempty"`
	App           *App         `json:"app,omitempty"`
	Annotations   []Annotation `json:"annotations,omitempty"`
	Dependencies  []Dependency `json:"dependencies,omitempty"`
	PathWhitelist []string     `json:"pathWhitelist,omitempty"`
}

// Label is a name/value pair qualifying an image (version, os, arch...).
type Label struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Annotation is free-form metadata.
type Annotation struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Dependency names an image this image is layered on.
type Dependency struct {
	ImageName string  `json:"imageName"`
	ImageID   string  `json:"imageID,omitempty"`
	Labels    []Label `json:"labels,omitempty"`
	Size      uint64  `json:"size,omitempty"`
}

// App is how to run an image's application (aci.md "app").
type App struct {
	Exec              []string        `json:"exec,omitempty"`
	User              string          `json:"user"`
	Group             string          `json:"group"`
	SupplementaryGIDs []int           `json:"supplementaryGIDs,omitempty"`
	WorkingDirectory  string          `json:"workingDirectory,omitempty"`
	Environment       []EnvVar        `json:"environment,omitempty"`
	MountPoints       []MountPoint    `json:"mountPoints,omitempty"`
	Ports             []Port          `json:"ports,omitempty"`
	Isolators         []Isolator      `json:"isolators,omitempty"`
	EventHandlers     json.RawMessage `json:"eventHandlers,omitempty"`
}

// EnvVar is one environment variable.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MountPoint is a place in the app's filesystem where a volume is mounted.
type MountPoint struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Port is a port the app listens on.
type Port struct {
	Name            string `json:"name"`
	Protocol        string `json:"protocol"`
	Port            uint   `json:"port"`
	Count           uint   `json:"count,omitempty"`
	SocketActivated bool   `json:"socketActivated,omitempty"`
}

// Isolator is an opaque resource or security isolator.
type Isolator struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value,omitempty"`
}

// PodManifest is the appc pod manifest (pods.md).
type PodManifest struct {
	ACKind      string       `json:"acKind"`
	ACVersion   string       `json:"acVersion"`
	Apps        []RuntimeApp `json:"apps"`
	Volumes     []Volume     `json:"volumes,omitempty"`
	Isolators   []Isolator   `json:"isolators,omitempty"`
	Annotations []Annotation `json:"annotations,omitempty"`
	Ports       []Port       `json:"ports,omitempty"`
}

// RuntimeApp is one app of a pod: an image plus overrides of its App.
type RuntimeApp struct {
	Name        string       `json:"name"`
	Image       RuntimeImage `json:"image"`
	App         *App         `json:"app,omitempty"`
	Mounts      []Mount      `json:"mounts,omitempty"`
	Annotations []Annotation `json:"annotations,omitempty"`
}

// RuntimeImage identifies the image of a RuntimeApp.
type RuntimeImage struct {
	Name   string  `json:"name,omitempty"`
	ID     string  `json:"id"`
	Labels []Label `json:"labels,omitempty"`
}

// Mount binds a pod volume to an app mount point.
type Mount struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// Volume is a pod volume: "empty" (pod-private scratch) or "host" (a host path).
type Volume struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Source   string `json:"source,omitempty"`
	ReadOnly *bool  `json:"readOnly,omitempty"`
}

// The validators below are written out rather than regular expressions:
// the stager validates its manifest right after it starts, and compiling
// even three small patterns there (code first run, allocations, page
// faults) cost more than the rest of the validation. schema_test.go checks
// them against the patterns they implement.

// ValidImageID reports whether id is an appc image ID: "sha512-" and 32 to
// 128 lower-case hex digits (^sha512-[0-9a-f]{32,128}$). Image IDs become
// directory names (/layers/<id>), so nothing else is accepted.
func ValidImageID(id string) bool {
	const prefix = "sha512-"
	if len(id) < len(prefix)+32 || len(id) > len(prefix)+128 || id[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ValidACName reports whether s is an appc AC Name of at most 253 bytes:
// lower-case letters, digits and inner dashes (^[a-z0-9]+([-a-z0-9]*[a-z0-9])?$),
// the form of app and volume names, which become directory names.
func ValidACName(s string) bool {
	if len(s) == 0 || len(s) > 253 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidEnvName reports whether s is a POSIX environment variable name
// (^[A-Za-z_][A-Za-z0-9_]*$).
func ValidEnvName(s string) bool {
	if len(s) == 0 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// Validate checks what Kurma relies on in an image manifest.
func (m *ImageManifest) Validate() error {
	if m.ACKind != KindImageManifest {
		return fmt.Errorf("acKind must be %q, got %q", KindImageManifest, m.ACKind)
	}
	if strings.TrimSpace(m.Name) == "" {
		return fmt.Errorf("image manifest has no name")
	}
	for _, d := range m.Dependencies {
		if d.ImageID != "" && !ValidImageID(d.ImageID) {
			return fmt.Errorf("dependency %q: invalid image ID %q", d.ImageName, d.ImageID)
		}
	}
	if m.App != nil {
		if err := m.App.Validate(); err != nil {
			return fmt.Errorf("app: %w", err)
		}
	}
	return nil
}

// Validate checks an App's environment names and mount point names.
func (a *App) Validate() error {
	for _, e := range a.Environment {
		if !ValidEnvName(e.Name) {
			return fmt.Errorf("invalid environment variable name %q", e.Name)
		}
	}
	for _, mp := range a.MountPoints {
		if !ValidACName(mp.Name) {
			return fmt.Errorf("invalid mount point name %q", mp.Name)
		}
	}
	return nil
}

// Validate checks a pod manifest: unique valid app names, valid image IDs,
// unique valid volume names, mounts that name existing volumes.
func (p *PodManifest) Validate() error {
	if p.ACKind != KindPodManifest {
		return fmt.Errorf("acKind must be %q, got %q", KindPodManifest, p.ACKind)
	}
	if len(p.Apps) == 0 {
		return fmt.Errorf("pod has no apps")
	}
	vols := map[string]bool{}
	for _, v := range p.Volumes {
		if !ValidACName(v.Name) {
			return fmt.Errorf("invalid volume name %q", v.Name)
		}
		if vols[v.Name] {
			return fmt.Errorf("duplicate volume %q", v.Name)
		}
		switch v.Kind {
		case "empty":
		case "host":
			if !strings.HasPrefix(v.Source, "/") {
				return fmt.Errorf("host volume %q needs an absolute source", v.Name)
			}
		default:
			return fmt.Errorf("volume %q: unknown kind %q", v.Name, v.Kind)
		}
		vols[v.Name] = true
	}
	apps := map[string]bool{}
	for _, a := range p.Apps {
		if !ValidACName(a.Name) {
			return fmt.Errorf("invalid app name %q", a.Name)
		}
		if apps[a.Name] {
			return fmt.Errorf("duplicate app %q", a.Name)
		}
		apps[a.Name] = true
		if !ValidImageID(a.Image.ID) {
			return fmt.Errorf("app %q: invalid image ID %q", a.Name, a.Image.ID)
		}
		if a.App != nil {
			if err := a.App.Validate(); err != nil {
				return fmt.Errorf("app %q: %w", a.Name, err)
			}
		}
		for _, m := range a.Mounts {
			if !vols[m.Volume] {
				return fmt.Errorf("app %q mounts unknown volume %q", a.Name, m.Volume)
			}
			if !strings.HasPrefix(m.Path, "/") {
				return fmt.Errorf("app %q: mount path %q is not absolute", a.Name, m.Path)
			}
		}
	}
	return nil
}

// Label returns the value of the named label and whether it is present.
func (m *ImageManifest) Label(name string) (string, bool) {
	for _, l := range m.Labels {
		if l.Name == name {
			return l.Value, true
		}
	}
	return "", false
}
