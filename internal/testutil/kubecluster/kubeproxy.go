package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Fixed kube-proxy ports inside the cluster's namespace.
const (
	kubeProxyMetricsPort = 10249
	kubeProxyHealthzPort = 10256
)

// StartKubeProxy runs bin/k8s/kube-proxy for the first node in nftables
// mode (the peer of Kurma's Services) and waits until it reports healthy,
// that is, until its first sync is done. Its tables live in the cluster's
// namespace. It sets the conntrack TCP timeouts of the node's network
// namespace as on a real node (they are per namespace), but not the
// conntrack table's size, which is the host's (--conntrack-max-per-core=0
// and --conntrack-min=0 keep it from writing that). It also
// routes ServiceCIDR through lo in the namespace (a node normally has a
// default route), so that the node's own sockets can reach Service IPs.
// extra flags are appended (e.g. --v=2 to log each "SyncProxyRules
// complete").
func (c *Cluster) StartKubeProxy(ctx context.Context, extra ...string) (*Process, error) {
	if c.NodeName == "" || c.ContainerdSocket == "" {
		return nil, errors.New("kube-proxy needs a cluster with a node")
	}
	return c.node0.StartKubeProxy(ctx, extra...)
}

// StartKubeProxy is Cluster.StartKubeProxy for this node: a kube-proxy of
// its own, in the node's namespaces, named kube-proxy<suffix> as the node's
// other daemons are.
func (n *Node) StartKubeProxy(ctx context.Context, extra ...string) (*Process, error) {
	if err := n.Do(func() error { return routeServices(n.IP) }); err != nil {
		return nil, fmt.Errorf("route %s: %w", ServiceCIDR, err)
	}
	kubeconfig := n.c.Kubeconfig
	if n != n.c.node0 {
		kubeconfig = filepath.Join(n.Dir, "kubelet", "kubeconfig")
	}
	args := append([]string{
		"--proxy-mode=nftables", "--kubeconfig=" + kubeconfig, "--hostname-override=" + n.Name,
		"--conntrack-max-per-core=0", "--conntrack-min=0",
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyMetricsPort),
		"--healthz-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyHealthzPort),
	}, extra...)
	name := "kube-proxy" + n.suffix
	p, err := n.StartProcess(name, exec.Command(filepath.Join(n.c.BinDir, "k8s", "kube-proxy"), args...))
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: n.DialContext}, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	url := "http://127.0.0.1:" + strconv.Itoa(kubeProxyHealthzPort) + "/healthz"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if res, err := hc.Do(req); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.Done():
			return nil, fmt.Errorf("kube-proxy of %s exited (%v):\n%s", n.Name, p.Err(), n.c.Logs(name, 4000))
		case <-ctx.Done():
			return nil, fmt.Errorf("kube-proxy of %s not healthy: %w:\n%s", n.Name, ctx.Err(), n.c.Logs(name, 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// routeServices adds ServiceCIDR via lo, source src (the node's address),
// in the current namespace (kube-proxy's output DNAT then re-routes to the
// endpoint).
func routeServices(src string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	_, dst, err := net.ParseCIDR(ServiceCIDR)
	if err != nil {
		return err
	}
	err = netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Src: net.ParseIP(src),
		Scope: netlink.SCOPE_LINK})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}
