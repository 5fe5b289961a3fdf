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

// StartKubeProxy runs bin/k8s/kube-proxy for the node in nftables mode (the
// peer of Kurma's Services) and waits until it reports healthy, that is,
// until its first sync is done. Its tables live in the cluster's namespace;
// its conntrack flags keep it from writing host sysctls. It also routes
// ServiceCIDR through lo in the namespace (a node normally has a default
// route), so that the node's own sockets can reach Service IPs. extra
// flags are appended (e.g. --v=2 to log each "SyncProxyRules complete").
func (c *Cluster) StartKubeProxy(ctx context.Context, extra ...string) (*Process, error) {
	if c.NodeName == "" || c.ContainerdSocket == "" {
		return nil, errors.New("kube-proxy needs a cluster with a node")
	}
	if err := c.Do(routeServices); err != nil {
		return nil, fmt.Errorf("route %s: %w", ServiceCIDR, err)
	}
	args := append([]string{
		"--proxy-mode=nftables", "--kubeconfig=" + c.Kubeconfig, "--hostname-override=" + c.NodeName,
		"--conntrack-max-per-core=0", "--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyMetricsPort),
		"--healthz-bind-address=127.0.0.1:" + strconv.Itoa(kubeProxyHealthzPort),
	}, extra...)
	p, err := c.StartProcess("kube-proxy", exec.Command(filepath.Join(c.BinDir, "k8s", "kube-proxy"), args...))
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}, Timeout: 2 * time.Second}
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
			return nil, fmt.Errorf("kube-proxy exited (%v):\n%s", p.Err(), c.Logs("kube-proxy", 4000))
		case <-ctx.Done():
			return nil, fmt.Errorf("kube-proxy not healthy: %w:\n%s", ctx.Err(), c.Logs("kube-proxy", 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// routeServices adds ServiceCIDR via lo, source NodeIP, in the current
// namespace (kube-proxy's output DNAT then re-routes to the endpoint).
func routeServices() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	_, dst, err := net.ParseCIDR(ServiceCIDR)
	if err != nil {
		return err
	}
	err = netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Src: net.ParseIP(NodeIP),
		Scope: netlink.SCOPE_LINK})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}
