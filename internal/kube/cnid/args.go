package cnid

import (
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

// PodArgs are the Kubernetes keys of CNI_ARGS.
type PodArgs struct {
	Namespace, Name, InfraContainerID, UID string
}

// ParseArgs parses CNI_ARGS ("K=V;K=V", in any order, as containerd and
// CRI-O send them). Unknown keys are errors unless IgnoreUnknown is 1 or
// true; a repeated key is an error. Namespace and name are required.
func ParseArgs(s string) (PodArgs, error) {
	var a PodArgs
	seen := map[string]string{}
	if s != "" {
		for _, kv := range strings.Split(s, ";") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: %q is not KEY=VALUE", kv)
			}
			if _, dup := seen[k]; dup {
				return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: key %s given twice", k)
			}
			seen[k] = v
		}
	}
	ignore := strings.EqualFold(seen["IgnoreUnknown"], "1") || strings.EqualFold(seen["IgnoreUnknown"], "true")
	for k, v := range seen {
		switch k {
		case "IgnoreUnknown":
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraContainerID = v
		case "K8S_POD_UID":
			a.UID = v
		default:
			if !ignore {
				return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: unknown key %s (and no IgnoreUnknown=1)", k)
			}
		}
	}
	if a.Namespace == "" || a.Name == "" {
		return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME are required")
	}
	if len(a.Namespace) > 63 || len(a.Name) > 253 || strings.ContainsAny(a.Namespace+a.Name, "/\x00") {
		return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: pod %s/%s is not a valid name", a.Namespace, a.Name)
	}
	if len(a.UID) > 64 {
		return a, kerrors.New(kerrors.Invalid, "CNI_ARGS: K8S_POD_UID too long")
	}
	return a, nil
}
