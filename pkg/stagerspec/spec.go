package stagerspec

import (
	"encoding/json"
	"fmt"

	"kurma.dev/kurma/pkg/appc"
)

// Paths inside the stager's root filesystem (absolute within its chroot).
const (
	ManifestPath = "/manifest"
	LayersDir    = "/layers"
	VolumesDir   = "/volumes"
	CallInDir    = "/opt/stager"

	StatusCallIn = "/opt/stager/status"
	LogsCallIn   = "/opt/stager/logs"
	RunCallIn    = "/opt/stager/run"
	AttachCallIn = "/opt/stager/attach"
)

// File descriptors of the protocol.
const (
	// ReadyFD is passed to the stager; it closes it once the pod is running.
	ReadyFD = 4
	// RunSettingsFD carries the RunSettings JSON to /opt/stager/run.
	RunSettingsFD = 3
)

// Manifest is the stager manifest written to /manifest.
type Manifest struct {
	KurmaVersion string `json:"kurmaVersion"`
	Name         string `json:"name"`
	// Pod is the appc pod manifest with the apps of the pod.
	Pod appc.PodManifest `json:"pod"`
	// Images maps every image ID named in AppImageOrder to its manifest.
	Images map[string]appc.ImageManifest `json:"images"`
	// AppImageOrder maps an app name to the IDs of the images that make up
	// its filesystem, top-most first. Each is bind-mounted at /layers/<id>.
	AppImageOrder map[string][]string `json:"appImageOrder"`
	// StagerConfig is passed through from the daemon's configuration.
	StagerConfig json.RawMessage `json:"stagerConfig,omitempty"`
}

// Validate checks that the manifest is self-consistent: a valid pod, and an
// image order for each app whose IDs are valid and described in Images.
func (m *Manifest) Validate() error {
	if err := m.Pod.Validate(); err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	for _, a := range m.Pod.Apps {
		order, ok := m.AppImageOrder[a.Name]
		if !ok {
			return fmt.Errorf("app %q has no image order", a.Name)
		}
		for _, id := range order {
			if !appc.ValidImageID(id) {
				return fmt.Errorf("app %q: invalid image ID %q", a.Name, id)
			}
			if _, ok := m.Images[id]; !ok {
				return fmt.Errorf("app %q: image %s not in images", a.Name, id)
			}
		}
	}
	for name := range m.AppImageOrder {
		found := false
		for _, a := range m.Pod.Apps {
			found = found || a.Name == name
		}
		if !found {
			return fmt.Errorf("image order for unknown app %q", name)
		}
	}
	return nil
}

// AppStatus is one app's entry in the output of /opt/stager/status, which is
// a JSON object keyed by app name (type Status).
type AppStatus struct {
	PID        int    `json:"pid,omitempty"`
	Exited     bool   `json:"exited"`
	ExitCode   *int   `json:"exitCode,omitempty"`
	ExitReason string `json:"exitReason,omitempty"`
}

// Status is the whole output of /opt/stager/status.
type Status map[string]AppStatus

// RunSettings is the JSON /opt/stager/run reads from RunSettingsFD.
type RunSettings struct {
	Exec              []string      `json:"exec"`
	User              string        `json:"user"`
	Group             string        `json:"group"`
	SupplementaryGIDs []int         `json:"supplementaryGIDs,omitempty"`
	WorkingDirectory  string        `json:"workingDirectory,omitempty"`
	Environment       []appc.EnvVar `json:"environment,omitempty"`
	TTY               bool          `json:"tty,omitempty"`
}

// Validate applies the spec's rules: exec, user and group are required and
// environment names are POSIX names.
func (s *RunSettings) Validate() error {
	if len(s.Exec) == 0 || s.Exec[0] == "" {
		return fmt.Errorf("exec is required")
	}
	if s.User == "" || s.Group == "" {
		return fmt.Errorf("user and group are required")
	}
	for _, e := range s.Environment {
		if !appc.ValidEnvName(e.Name) {
			return fmt.Errorf("invalid environment variable name %q", e.Name)
		}
	}
	return nil
}
