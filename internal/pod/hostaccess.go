package pod

import (
	"encoding/base64"
	"encoding/json"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// HostPrivilegedLabel is the label or annotation by which an image declares
// that it needs host privilege (a network plugin image).
const HostPrivilegedLabel = "kurma.dev/host-privileged"

// HostPrivilegedCaps is the capability set of a host-privileged app (and of
// what its run call-ins start): what a CNI plugin needs and no more.
//
//   - CAP_NET_ADMIN: create, move and configure links, addresses, routes,
//     bridges; program nftables (ipMasq, portmap); write net sysctls such
//     as net.ipv4.ip_forward.
//   - CAP_SYS_ADMIN: setns(2) into a pod's network namespace (the kernel
//     asks for it in both namespaces' user namespace).
//   - CAP_NET_RAW: raw sockets for the gratuitous ARP / neighbour
//     advertisements the bridge, ptp, macvlan and ipvlan plugins send.
//
// It replaces the default set (no CAP_SETUID, CAP_CHOWN, CAP_MKNOD ...):
// the plugins run as root and only touch files root owns.
var HostPrivilegedCaps = []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_RAW"}

// isolatorCapsRetain is the AppC isolator the stager reads (stager.IsolatorCapsRetain).
const isolatorCapsRetain = "os/linux/capabilities-retain-set"

// ImageDeclaresHostPrivilege reports whether an image manifest declares
// HostPrivilegedLabel=true, as an annotation or as a label.
func ImageDeclaresHostPrivilege(m appc.ImageManifest) bool {
	for _, a := range m.Annotations {
		if a.Name == HostPrivilegedLabel && a.Value == "true" {
			return true
		}
	}
	for _, l := range m.Labels {
		if l.Name == HostPrivilegedLabel && l.Value == "true" {
			return true
		}
	}
	return false
}

// hostAccess adds to a stager manifest what the spec's daemon-only options
// and an app's Stdin ask for. ra is the app's RuntimeApp, img its image's
// manifest; it is called once per app and once with ra == nil for the pod.
func hostAccess(m *appc.PodManifest, spec Spec, a *AppSpec, ra *appc.RuntimeApp, img appc.ImageManifest) error {
	if ra == nil {
		add := func(name, value string) {
			m.Annotations = append(m.Annotations, appc.Annotation{Name: name, Value: value})
		}
		if spec.HostIPC {
			add(stagerspec.HostIPCAnnotation, "true")
		}
		if spec.HostUTS {
			add(stagerspec.HostUTSAnnotation, "true")
		}
		if spec.VolumePropagation {
			add(stagerspec.VolumePropagationAnnotation, "rslave")
		}
		return nil
	}
	if len(a.Stdin) > 0 {
		if a.TTY {
			return kerrors.New(kerrors.Invalid, "app %s: stdin content and a terminal exclude each other", a.Name)
		}
		ra.Annotations = append(ra.Annotations, appc.Annotation{Name: stagerspec.StdinAnnotation, Value: base64.StdEncoding.EncodeToString(a.Stdin)})
	}
	if a.HostPrivileged && ImageDeclaresHostPrivilege(img) {
		v, err := json.Marshal(map[string][]string{"set": HostPrivilegedCaps})
		if err != nil {
			return err
		}
		// Replace whatever the image asked for: the retain set is ours.
		app := ra.App
		kept := app.Isolators[:0:0]
		for _, iso := range app.Isolators {
			if iso.Name != isolatorCapsRetain {
				kept = append(kept, iso)
			}
		}
		app.Isolators = append(kept, appc.Isolator{Name: isolatorCapsRetain, Value: v})
		ra.Annotations = append(ra.Annotations, appc.Annotation{Name: stagerspec.HostPrivilegedAnnotation, Value: "true"})
	}
	return nil
}

// hostShared lists the clone flags of the host namespaces a pod keeps
// (Spec.HostIPC, Spec.HostUTS).
func hostShared(spec Spec) []uintptr {
	var out []uintptr
	if spec.HostIPC {
		out = append(out, unix.CLONE_NEWIPC)
	}
	if spec.HostUTS {
		out = append(out, unix.CLONE_NEWUTS)
	}
	return out
}
