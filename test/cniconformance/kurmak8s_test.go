package cniconformance_test

import (
	"context"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	corev1 "k8s.io/api/core/v1"
	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	"kurma.dev/kurma/test/cniconformance"
)

// TestKurmaK8sConformance runs the suite on the Kubernetes driver: the
// kurma-k8s shim, the agent's CNI daemon, the watcher and the controller,
// against a real API server. Each container of the suite gets a pod (bound
// to the agent's node) whose CNI_ARGS the runtime would send.
func TestKurmaK8sConformance(t *testing.T) {
	e := kubetest.Start(t, kubecluster.Options{NoNode: true})
	ctx := context.Background()
	if _, err := e.C.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "conf-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Namespace("conformance")
	e.StartWatcher()
	a := e.StartAgent("conf-node", kubecluster.NodeIP, "--k8s-annotation-timeout", "5s")
	cniconformance.Run(t, cniconformance.Plugin{
		Type:               "kurma-k8s",
		Path:               []string{e.C.BinDir},
		HostNetNS:          true,
		TransientHostState: true,
		Settle:             10 * time.Second,
		ErrorsHaveVersion:  true,
		GCReleases:         true,
		Versions:           []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"},
		Config: func(t testing.TB, v string) []byte {
			return []byte(`{"cniVersion":"` + v + `","name":"kurma","type":"kurma-k8s","socket":"` + a.Socket + `"}`)
		},
		Prepare: func(t testing.TB, c *cniconformance.Container) {
			name := "pod-" + strings.ToLower(c.ID)
			p, err := e.C.Client.CoreV1().Pods("conformance").Create(ctx, kubetest.Pod("conformance", name, "conf-node"), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c.Args = [][2]string{{"K8S_POD_NAMESPACE", "conformance"}, {"K8S_POD_NAME", name},
				{"K8S_POD_INFRA_CONTAINER_ID", c.ID}, {"K8S_POD_UID", string(p.UID)}}
		},
		// What ADD creates and DEL removes on the node: attachment
		// records (the controller port is the watcher's, made with the pod).
		ExternalState: func(t testing.TB, _ []byte) []string {
			ents, err := os.ReadDir(a.StateDir + "/k8s")
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, x := range ents {
				out = append(out, x.Name())
			}
			sort.Strings(out)
			return out
		},
		InvalidConfigs: func(t testing.TB, v string) []cniconformance.InvalidConfig {
			return []cniconformance.InvalidConfig{
				{Name: "agent-not-listening", Config: []byte(`{"cniVersion":"` + v + `","name":"kurma","type":"kurma-k8s","socket":"` + a.Socket + `.none"}`), Code: types.ErrTryAgainLater},
				{Name: "chained", Config: []byte(`{"cniVersion":"` + v + `","name":"kurma","type":"kurma-k8s","socket":"` + a.Socket + `","prevResult":{"cniVersion":"` + v + `"}}`), Code: types.ErrInvalidNetworkConfig},
			}
		},
	})
}
