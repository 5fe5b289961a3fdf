package podtypes

import (
	"encoding/json"
	"time"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

// AppSpec describes one app of a pod as a user asks for it.
type AppSpec struct {
	// Name of the app; defaults to a name derived from the image.
	Name string `json:"name,omitempty"`
	// Image is a URI (docker://, file://, http(s)://), a stored reference or
	// an image ID.
	Image string `json:"image"`
	// Exec overrides the image's exec (command and arguments) when set.
	Exec             []string      `json:"exec,omitempty"`
	Env              []appc.EnvVar `json:"env,omitempty"`
	User             string        `json:"user,omitempty"`
	Group            string        `json:"group,omitempty"`
	WorkingDirectory string        `json:"workingDirectory,omitempty"`
	Mounts           []appc.Mount  `json:"mounts,omitempty"`
	// TTY allocates a terminal for the app (for attach).
	TTY bool `json:"tty,omitempty"`
	// TTYSize is the terminal's size when the app starts (TTY only;
	// default: whatever the stager gives).
	TTYSize *TermSize `json:"ttySize,omitempty"`
	// Stdin, when set, is what the app's main executable reads on its
	// stdin, followed by EOF (stagerspec.StdinAnnotation; not with TTY).
	Stdin []byte `json:"stdin,omitempty"`
	// HostPrivileged asks for host privilege (HostPrivilegedCaps and a
	// writable /proc/sys), granted only when the app's image declares
	// HostPrivilegedLabel=true (ImageDeclaresHostPrivilege). Reserved for
	// the daemon's networking pod: the API refuses it.
	HostPrivileged bool `json:"hostPrivileged,omitempty"`
}

// Spec describes a pod to create.
type Spec struct {
	Name    string        `json:"name"`
	Apps    []AppSpec     `json:"apps"`
	Volumes []appc.Volume `json:"volumes,omitempty"`
	// Networks lists the networks to attach (names from pod_networks);
	// empty means the default networks; ["host"] the host's namespace;
	// ["none"] loopback only.
	Networks []string `json:"networks,omitempty"`
	// StagerImage overrides the daemon's default stager.
	StagerImage string `json:"stagerImage,omitempty"`
	// HostIPC and HostUTS keep the pod in the host's IPC and UTS
	// namespaces (the stager then never sets a hostname). Reserved for the
	// daemon's networking pod: the API refuses them.
	HostIPC bool `json:"hostIPC,omitempty"`
	HostUTS bool `json:"hostUTS,omitempty"`
	// VolumePropagation makes the pod's mounts slaves of the host's
	// (rslave instead of rprivate), so that mounts the host makes later
	// under a shared host volume appear inside the apps. Reserved for the
	// networking pod's netns volume: the API refuses it.
	VolumePropagation bool `json:"volumePropagation,omitempty"`
}

// Reserved reports which daemon-only options a spec sets ("" if none):
// the API refuses user specs that use them.
func (s *Spec) Reserved() string {
	switch {
	case s.HostIPC:
		return "hostIPC"
	case s.HostUTS:
		return "hostUTS"
	case s.VolumePropagation:
		return "volumePropagation"
	}
	for _, a := range s.Apps {
		if a.HostPrivileged {
			return "hostPrivileged"
		}
	}
	return ""
}

// State is where a pod is in its life.
type State string

// Pod states. A pod moves Creating -> Running -> Stopping -> Exited, or to
// Errored from any state when its stager dies or a step fails after start.
const (
	Creating State = "creating"
	Running  State = "running"
	Stopping State = "stopping"
	Exited   State = "exited"
	Errored  State = "errored"
)

// AppInfo is one app of a created pod.
type AppInfo struct {
	Name    string                `json:"name"`
	Image   string                `json:"image"`
	ImageID string                `json:"imageID"`
	Status  *stagerspec.AppStatus `json:"status,omitempty"`
}

// Pod is the daemon's record of a pod.
type Pod struct {
	UUID      string    `json:"uuid"`
	Name      string    `json:"name"`
	State     State     `json:"state"`
	Spec      Spec      `json:"spec"`
	Apps      []AppInfo `json:"apps"`
	StagerPID int       `json:"stagerPID,omitempty"`
	// NetNS is the path of the pod's network namespace reference.
	NetNS    string    `json:"netns,omitempty"`
	Created  time.Time `json:"created"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	// Error says why a pod is Errored.
	Error string `json:"error,omitempty"`
	// Networks holds one entry per attached network (the networking issue
	// fills it: interface, CNI result).
	Networks []json.RawMessage `json:"networks,omitempty"`
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// TTYAnnotation on a RuntimeApp of the stager manifest ("true") asks the
// stager for a terminal for that app (AppSpec.TTY; docs/stager.md).
const TTYAnnotation = "kurma.dev/tty"

// TTYSizeAnnotation ("ROWSxCOLS") is the size of that terminal when the app
// starts (AppSpec.TTYSize).
const TTYSizeAnnotation = "kurma.dev/tty-size"

// ValidName reports whether s may name a pod: 1 to 63 letters, digits,
// '_', '.' or '-', starting with a letter or digit (names become directory
// and host names). Written out rather than a regexp, whose compilation
// at start-up every kurma command would pay.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return true
}
