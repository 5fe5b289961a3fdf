package stagerspec

// Annotations of the stager manifest by which the daemon asks a stager for
// what its networking pod needs (docs/stager.md). They are Kurma's own
// extensions, not part of the stager spec; a stager that ignores them
// still runs ordinary pods.
const (
	// StdinAnnotation on a RuntimeApp: base64 (standard, padded) of what
	// the app's main executable reads on stdin; the stager writes it and
	// then closes the app's stdin (EOF).
	StdinAnnotation = "kurma.dev/stdin"
	// HostIPCAnnotation and HostUTSAnnotation on the pod ("true"): the pod
	// init stays in the host's IPC / UTS namespace; with UTS the stager
	// sets no hostname.
	HostIPCAnnotation = "kurma.dev/host-ipc"
	HostUTSAnnotation = "kurma.dev/host-uts"
	// VolumePropagationAnnotation on the pod ("rslave"): the pod init and
	// its apps keep their mounts slaves (not private), so mounts the host
	// makes later under a shared volume appear in the apps.
	VolumePropagationAnnotation = "kurma.dev/volume-propagation"
	// HostPrivilegedAnnotation on a RuntimeApp ("true"): the app's
	// /proc/sys stays writable; every other app gets it read-only.
	HostPrivilegedAnnotation = "kurma.dev/host-privileged"
)

// Pre-started stagers, Kurma's extension of the launch (docs/stager.md,
// "Pre-started stagers"). A stager image that carries PrestartAnnotation
// ("true") may be started before its pod exists, in the namespaces,
// cgroups and root the pod will have. The daemon then sets PrestartEnv to
// the number of a descriptor the stager must read one byte from before it
// looks at /manifest, /layers or /volumes: the byte says the pod's files
// are in place; EOF instead says the daemon let it go, and it exits 0
// without doing anything. Such a stager sets the pod's hostname itself.
const (
	PrestartAnnotation = "kurma.dev/stager-prestart"
	PrestartEnv        = "KURMA_STAGER_GO_FD"
)
