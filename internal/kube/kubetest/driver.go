package kubetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// StartWithDriver is Start with the kurma-k8s driver as the node's CNI:
// the node's plugin folder holds the shim, and its conflist names a socket
// in a short folder of its own (a unix socket path must stay under 108
// bytes), returned for the agent to listen on (StartAgentAt). With
// opts.Nodes > 1 that folder is private to each node (Options.NodeDirs):
// every node's agent listens at the same path, as on separate machines
// (StartAgentOn).
func StartWithDriver(t *testing.T, opts kubecluster.Options) (e *Env, socket string) {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "kurma-kt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	socket = filepath.Join(sockDir, "cni.sock")
	binDir := t.TempDir()
	if err := os.Symlink(filepath.Join(kubecluster.BinDir(), "kurma-k8s"), filepath.Join(binDir, "kurma-k8s")); err != nil {
		t.Fatal(err)
	}
	opts.CNIConfList, opts.CNIBinDir = ConfList(socket), binDir
	if opts.Nodes > 1 {
		opts.NodeDirs = append(opts.NodeDirs, sockDir)
	}
	return Start(t, opts), socket
}

// Cnitool returns a runner of cnitool (add, del, check) for the network
// "kurma" of the driver on socket, on the namespace netnsPath, with
// CNI_ARGS as containerd sends them for pod namespace/name of UID uid
// (the infra container id cid).
func Cnitool(t *testing.T, ctx context.Context, socket, netnsPath, namespace, name, cid, uid string) func(verb string) (string, error) {
	t.Helper()
	confDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(confDir, "10-kurma.conflist"), ConfList(socket), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(verb string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(kubecluster.BinDir(), "tools", "cnitool"), verb, "kurma", netnsPath)
		cmd.Env = append(os.Environ(), "NETCONFPATH="+confDir, "CNI_PATH="+kubecluster.BinDir(),
			"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+namespace+";K8S_POD_NAME="+name+";K8S_POD_INFRA_CONTAINER_ID="+cid+";K8S_POD_UID="+uid)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// ApplySlice creates an EndpointSlice, or replaces the one of that name,
// as a controller managing a selector-less Service's slices would.
func ApplySlice(ctx context.Context, kc kubernetes.Interface, s *discoveryv1.EndpointSlice) error {
	api := kc.DiscoveryV1().EndpointSlices(s.Namespace)
	cur, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
	case err == nil:
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	}
	return err
}
