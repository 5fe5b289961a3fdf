package main

import (
	"context"
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

func convertRules(in map[string]*netpol.Rules) map[string]*policypath.Pod {
	out := make(map[string]*policypath.Pod, len(in))
	dir := func(d netpol.Dir) policypath.Dir {
		o := policypath.Dir{Isolated: d.Isolated, Allow: make([]policypath.Allow, len(d.Allow))}
		for i, a := range d.Allow {
			o.Allow[i] = policypath.Allow{PeerLo: a.PeerLo, PeerHi: a.PeerHi, Proto: uint8(a.Proto), PortLo: a.PortLo, PortHi: a.PortHi}
		}
		return o
	}
	for k, r := range in {
		if r == nil {
			out[k] = nil
			continue
		}
		out[k] = &policypath.Pod{IP: r.IP, Ingress: dir(r.Ingress), Egress: dir(r.Egress)}
	}
	return out
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
