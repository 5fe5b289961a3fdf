package kubecluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BridgeConfList is a CNI conflist of the upstream bridge plugin with
// host-local IPAM: the usual default CNI of a node, and the peer of Kurma's
// driver. bridge names the Linux bridge (in the node's namespace), subnet
// is the pods' range, and dataDir host-local's lease folder.
func BridgeConfList(bridge, subnet, dataDir string) []byte {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kurma-test-bridge",
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": dataDir,
				"ranges":  []any{[]any{map[string]any{"subnet": subnet}}},
				"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	b, _ := json.Marshal(conf) // a map of plain values always marshals
	return b
}

// ChainPortmap returns conflist with the upstream portmap plugin (its
// nftables backend, table cni_hostport of the node's namespace) appended to
// its plugins: hostPort, as containerd passes the pods' port mappings to
// every plugin of the chain that declares the capability.
func ChainPortmap(conflist []byte) ([]byte, error) {
	var conf map[string]any
	if err := json.Unmarshal(conflist, &conf); err != nil {
		return nil, fmt.Errorf("chain portmap: %w", err)
	}
	plugins, ok := conf["plugins"].([]any)
	if !ok {
		return nil, errors.New("chain portmap: the conflist has no plugins list")
	}
	conf["plugins"] = append(plugins, map[string]any{"type": "portmap", "backend": "nftables",
		"capabilities": map[string]any{"portMappings": true}})
	return json.Marshal(conf)
}

// WaitPodsRunning waits until at least n pods of namespace that match
// selector (a label selector, "" for all) are Running with a pod IP, and
// returns them.
func (c *Cluster) WaitPodsRunning(ctx context.Context, namespace, selector string, n int) ([]corev1.Pod, error) {
	var last string
	for {
		list, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			var running []corev1.Pod
			phases := map[corev1.PodPhase]int{}
			for _, p := range list.Items {
				phases[p.Status.Phase]++
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
					running = append(running, p)
				}
			}
			if len(running) >= n {
				return running, nil
			}
			last = fmt.Sprintf("%d pods, phases %v", len(list.Items), phases)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d running pods in %q (%q): %w (last: %s)", n, namespace, selector, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitNoPods waits until no pod of namespace matches selector.
func (c *Cluster) WaitNoPods(ctx context.Context, namespace, selector string) error {
	for {
		list, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil && len(list.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			left := -1
			if list != nil {
				left = len(list.Items)
			}
			return fmt.Errorf("waiting for pods in %q (%q) to go: %w (%d left)", namespace, selector, ctx.Err(), left)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
