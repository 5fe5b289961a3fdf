package pod

import (
	"context"
	"io"
	"time"

	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/stagerspec"
)

// IO connects a caller's streams to a process in a pod.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer // ignored when TTY is set: the terminal merges them
	TTY    bool
	// Resize delivers terminal size changes when TTY is set.
	Resize <-chan TermSize
	// CloseStdin (Attach only): Stdin's EOF closes the app's stdin (sends
	// the EOF character to an app with a terminal); otherwise the app's
	// stdin stays open for later attaches.
	CloseStdin bool
}

// Manager runs pods. Errors wrap kerrors categories: NotFound for an unknown
// pod or app, Conflict for a duplicate name or a wrong state (removing a
// running pod without force), Invalid for a bad spec, Unauthorized for an
// untrusted stager image.
type Manager interface {
	// Create resolves the images, stages the pod and starts it, returning
	// once the stager has signalled readiness. On any failure every step
	// already done is rolled back and the error returned.
	Create(ctx context.Context, spec Spec) (*Pod, error)
	// Get finds a pod by UUID, unique UUID prefix or name.
	Get(ctx context.Context, ref string) (*Pod, error)
	List(ctx context.Context) ([]*Pod, error)
	// Stop sends SIGTERM to the stager and SIGKILL after grace, then tears
	// the pod's resources down, keeping its record (state Exited).
	Stop(ctx context.Context, ref string, grace time.Duration) error
	// Remove deletes a stopped pod's record and directories; force stops it
	// first.
	Remove(ctx context.Context, ref string, force bool) error
	// Status runs the status call-in.
	Status(ctx context.Context, ref string) (stagerspec.Status, error)
	// Exec runs a command in an app through the run call-in and returns its
	// exit code.
	Exec(ctx context.Context, ref, app string, s stagerspec.RunSettings, stdio IO) (int, error)
	// Logs copies an app's log to w through the logs call-in, following it
	// when follow is set until ctx ends or the app exits.
	Logs(ctx context.Context, ref, app string, follow bool, w io.Writer) error
	// Attach connects stdio to an app through the attach call-in until
	// either side closes.
	Attach(ctx context.Context, ref, app string, stdio IO) error
}

// The pod types of the API live in podtypes, which the CLI links without
// this runtime; these names keep them where the runtime's users look.
type (
	AppSpec  = podtypes.AppSpec
	Spec     = podtypes.Spec
	State    = podtypes.State
	AppInfo  = podtypes.AppInfo
	Pod      = podtypes.Pod
	TermSize = podtypes.TermSize
)

// Pod states (podtypes).
const (
	Creating = podtypes.Creating
	Running  = podtypes.Running
	Stopping = podtypes.Stopping
	Exited   = podtypes.Exited
	Errored  = podtypes.Errored
)

// Stager manifest annotations of terminals (podtypes).
const (
	TTYAnnotation     = podtypes.TTYAnnotation
	TTYSizeAnnotation = podtypes.TTYSizeAnnotation
)
