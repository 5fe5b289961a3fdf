package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/agent/policypath"
	"kurma.dev/kurma/internal/kube/cnid"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/netpol"
)

type k8sOpts struct {
	node, kubeconfig, socket, hostID, stateDir string
	timeout                                    time.Duration
	binDir, confDir                            string
	portmap                                    bool
	metrics                                    prometheus.Registerer
	policy                                     cnid.PolicyGate // nil: no NetworkPolicy
}

// newCNID builds the CNI daemon of Kubernetes mode, installing the shim
// and its conflist first when asked (as a DaemonSet does on each node).
func newCNID(o k8sOpts, kc kubernetes.Interface, a *agent.Agent, log *slog.Logger) (*cnid.Daemon, error) {
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
	return cnid.New(cnid.Config{Kube: kc, NodeName: o.node, HostID: o.hostID, Agent: a, Socket: o.socket,
		StateDir: o.stateDir, AnnotationTimeout: o.timeout, Logger: log, Metrics: o.metrics, Policy: o.policy})
}

// kubeClient is the client of Kubernetes mode: from kubeconfig, else the
// in-cluster config.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	// Protobuf, as kube-proxy and the kubelet use: the agent watches
	// built-in types only, and a cold start lists every pod and policy of
	// the cluster (decoding protobuf costs a fraction of JSON).
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(rc)
}

// policyPath adapts the agent's policypath to the netpol engine's rules.
type policyPath struct{ p *policypath.Path }

func (pp policyPath) Apply(ctx context.Context, ch map[string]*netpol.Rules) error {
	return pp.p.Apply(ctx, convertRules(ch))
}

func (pp policyPath) Sync(ctx context.Context, all map[string]*netpol.Rules) error {
	return pp.p.Sync(ctx, convertRules(all))
}

// convertRules hands the engine's rules to the path: the same values
// (policyrule's types), only the map is new, so a change's allow lists are
// not copied.
func convertRules(in map[string]*netpol.Rules) map[string]*policypath.Pod {
	return netpol.PathRules(in)
}

// installShim copies the kurma-k8s binary that sits next to this one into
// dir, atomically (a runtime may exec it at any moment).
func installShim(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install shim: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), shimName))
	if err != nil {
		return fmt.Errorf("install shim: %w", err)
	}
	return writeAtomic(filepath.Join(dir, shimName), b, 0o755, "")
}

// Names of what Kubernetes mode installs on the node.
const (
	shimName = "kurma-k8s"
	confName = "10-kurma.conflist"
)

// installConf writes the conflist that makes kurma-k8s the node's CNI
// (with portmap chained for hostPort when asked), staged outside the
// watched folder (see writeAtomic), then makes the runtime reload it.
func installConf(dir, socket string, portmap bool) error {
	if err := writeAtomic(filepath.Join(dir, confName), cniwire.ConfList(socket, portmap), 0o644, filepath.Dir(filepath.Clean(dir))); err != nil {
		return err
	}
	return pokeDir(dir)
}

// pokeDir makes a runtime that watches dir reload it: containerd 1.6
// ignores Create events (a file renamed in is one) and reloads on Write,
// Rename and Remove, so an empty hidden file is made and removed. No
// runtime loads it (not a .conf, .conflist or .json name), and no event
// shows a partial conflist.
func pokeDir(dir string) error {
	p := filepath.Join(dir, ".kurma-reload")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	_ = f.Close()
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}

// writeAtomic writes b to path through a temporary file renamed over it,
// so that a reader sees the old file or the new one, never a part. The
// temporary file lives in tmpDir ("": path's own folder). A CNI
// configuration folder is watched by the runtime, which logs an error for
// every file it cannot parse there: conflists are staged in its parent
// folder (same mount, as the DaemonSet mounts /etc/cni), or, when that is
// another file system, in a hidden subfolder.
func writeAtomic(path string, b []byte, mode os.FileMode, tmpDir string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	if tmpDir == "" {
		tmpDir = dir
	}
	err := stageRename(path, b, mode, tmpDir)
	if errors.Is(err, unix.EXDEV) || errors.Is(err, os.ErrPermission) {
		hidden := filepath.Join(dir, ".kurma-staging")
		if err = os.MkdirAll(hidden, 0o700); err == nil {
			err = stageRename(path, b, mode, hidden)
			_ = os.Remove(hidden)
		}
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	return nil
}

func stageRename(path string, b []byte, mode os.FileMode, tmpDir string) error {
	f, err := os.CreateTemp(tmpDir, "."+filepath.Base(path)+".kurma-tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, mode)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}
