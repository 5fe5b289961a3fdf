package podports

import "strings"

// keyKinds name the kinds of queued keys (their prefix before "/") in
// the kurma_k8s_watcher_sync_duration_seconds metric (docs/kubernetes.md).
var keyKinds = map[string]string{"p": "pod", "n": "namespace", resyncKey: "resync"}

func keyKind(key string) string {
	prefix, _, _ := strings.Cut(key, "/")
	if kind, ok := keyKinds[prefix]; ok {
		return kind
	}
	return "other"
}
