package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/kube/cnid"
	"kurma.dev/kurma/internal/kube/cniwire"
)

type k8sOpts struct {
	node, kubeconfig, socket, hostID, stateDir string
	timeout                                    time.Duration
	binDir, confDir                            string
	portmap                                    bool
	metrics                                    prometheus.Registerer
}

// newCNID builds the CNI daemon of Kubernetes mode, installing the shim
// and its conflist first when asked (as a DaemonSet does on each node).
func newCNID(o k8sOpts, a *agent.Agent, log *slog.Logger) (*cnid.Daemon, error) {
	if o.binDir != "" {
		if err := installShim(o.binDir); err != nil {
			return nil, err
		}
	}
	if o.confDir != "" {
		if err := installConf(o.confDir, o.socket, o.portmap); err != nil {
			return nil, err
		}
	}
	var rc *rest.Config
	var err error
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return cnid.New(cnid.Config{Kube: kc, NodeName: o.node, HostID: o.hostID, Agent: a, Socket: o.socket,
		StateDir: o.stateDir, AnnotationTimeout: o.timeout, Logger: log, Metrics: o.metrics})
}

// installShim copies the kurma-k8s binary that sits next to this one into
// dir, atomically (a runtime may exec it at any moment).
func installShim(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install shim: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "kurma-k8s"))
	if err != nil {
		return fmt.Errorf("install shim: %w", err)
	}
	return writeAtomic(filepath.Join(dir, "kurma-k8s"), b, 0o755)
}

// installConf writes the conflist that makes kurma-k8s the node's CNI
// (with portmap chained for hostPort when asked).
func installConf(dir, socket string, portmap bool) error {
	return writeAtomic(filepath.Join(dir, "10-kurma.conflist"), cniwire.ConfList(socket, portmap), 0o644)
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	tmp := path + ".kurma-tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	return nil
}
