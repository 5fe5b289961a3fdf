package wire

import (
	"encoding/json"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/appc"
)

// Version is the API's version prefix.
const Version = "v1"

// DefaultSocket is where kurmad listens unless configured otherwise.
const DefaultSocket = "/run/kurma/kurma.sock"

// UpgradeProtocol is the value of the Upgrade header of streaming calls.
const UpgradeProtocol = "kurma-stream"

// ErrorTrailer carries the JSON error body of a failed logs stream.
const ErrorTrailer = "Kurma-Error"

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorInfo `json:"error"`
}

// ErrorInfo is an error's category (kerrors.Type) and message.
type ErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	// ExitCode, when not 0, is the exit code a client should end with:
	// 126 or 127 when an app's command could not be executed.
	ExitCode int `json:"exitCode,omitempty"`
}

// CreatePodRequest is the body of POST /v1/pods.
type CreatePodRequest struct {
	Spec podtypes.Spec `json:"spec"`
	// Wait turns the call into a stream (the client must ask for an
	// upgrade): the server creates the pod, streams the first app's output
	// until it exits, sends its exit code and, with Remove, removes the podtypes.
	Wait bool `json:"wait,omitempty"`
	// Remove (with Wait) removes the pod once its first app has exited.
	Remove bool `json:"remove,omitempty"`
	// Stdin (with Wait) forwards the client's stdin frames to the app
	// (through attach).
	Stdin bool `json:"stdin,omitempty"`
}

// StopRequest is the body of POST /v1/pods/{ref}/stop.
type StopRequest struct {
	// GraceSeconds is the time between SIGTERM and SIGKILL; negative means
	// the daemon's default (10 s).
	GraceSeconds int `json:"graceSeconds"`
}

// ExecRequest is the body of POST /v1/pods/{ref}/exec. Empty user, group,
// working directory mean the app's own; Env is added to the app's.
type ExecRequest struct {
	App              string        `json:"app,omitempty"`
	Exec             []string      `json:"exec"`
	Env              []appc.EnvVar `json:"env,omitempty"`
	User             string        `json:"user,omitempty"`
	Group            string        `json:"group,omitempty"`
	WorkingDirectory string        `json:"workingDirectory,omitempty"`
	TTY              bool          `json:"tty,omitempty"`
	Stdin            bool          `json:"stdin,omitempty"`
	Rows             uint16        `json:"rows,omitempty"`
	Cols             uint16        `json:"cols,omitempty"`
}

// AttachRequest is the body of POST /v1/pods/{ref}/attach.
type AttachRequest struct {
	App   string `json:"app,omitempty"`
	TTY   bool   `json:"tty,omitempty"`
	Stdin bool   `json:"stdin,omitempty"`
	// CloseStdin: the client's EOF on stdin closes the app's stdin
	// (default: it only detaches input).
	CloseStdin bool   `json:"closeStdin,omitempty"`
	Rows       uint16 `json:"rows,omitempty"`
	Cols       uint16 `json:"cols,omitempty"`
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	URI      string `json:"uri"`
	Insecure bool   `json:"insecure,omitempty"`
}

// PullEvent is one NDJSON line of a pull: progress, then either the image
// or an error.
type PullEvent struct {
	Progress *image.Progress `json:"progress,omitempty"`
	Image    *image.Image    `json:"image,omitempty"`
	Error    *ErrorInfo      `json:"error,omitempty"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version    string `json:"version"`
	APIVersion string `json:"apiVersion"`
	GoVersion  string `json:"goVersion"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
}

// Control is the payload of a control frame.
type Control struct {
	// Type is one of "pod" (Pod set: the pod a run created), "resize"
	// (Rows, Cols), "stdin-close", "exit" (Code) or "error" (Error).
	Type  string        `json:"type"`
	Pod   *podtypes.Pod `json:"pod,omitempty"`
	Rows  uint16        `json:"rows,omitempty"`
	Cols  uint16        `json:"cols,omitempty"`
	Code  int           `json:"code"`
	Error *ErrorInfo    `json:"error,omitempty"`
}

// MustJSON encodes one of this package's own types (which cannot fail).
func MustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own plain types go through here.
		panic(err)
	}
	return b
}

// NetworkInfo is one entry of GET /v1/networks: a configured pod network
// and the state of its plugin container ("starting", "running", "failed").
type NetworkInfo struct {
	Name     string `json:"name"`
	Image    string `json:"image"`
	Default  bool   `json:"default"`
	State    string `json:"state"`
	Error    string `json:"error,omitempty"`
	Restarts int    `json:"restarts,omitempty"`
}
