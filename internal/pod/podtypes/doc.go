// Package podtypes holds the pod types that cross the daemon's API: what a
// user asks for (Spec, AppSpec), what a pod is (Pod, AppInfo, State) and
// the terminal annotations of the stager manifest. internal/pod (the
// runtime) re-exports them under its own name.
//
// It exists so that the kurma CLI can speak about pods without linking the
// runtime, so nothing with start-up cost beyond encoding/json and pkg/appc,
// pkg/stagerspec.
// Must not depend on: `kurma.dev/kurma/internal/pod`, `net/http`,
// `kurma.dev/kurma/internal/image`, `kurma.dev/kurma/internal/stager`.
package podtypes
