// Command reach measures, on a real single-node cluster without
// kube-proxy, how long a new Service takes to answer a pod: from the
// Service's create returning in the API until a client pod's TCP
// connection to the clusterIP is answered by one of its backends. The
// path it times is the whole of Kurma's: kube-controller-manager writes
// the EndpointSlice, kurma-k8s-watcher turns Service and slice into a load
// balancer at kurma-controller, kurma-agent programs nftables, and the
// packet from the pod's namespace is DNATed to a backend pod. -present
// Services (same backends) exist before the timed adds.
//
// The client probes from inside its pod's network namespace: a dial with
// a 25 ms timeout, again every 2 ms until a backend answers "hostname".
// Before the load balancer exists the packet goes unanswered; while it has
// no members yet the SYN gets a reset. The resolution is a few
// milliseconds.
//
// Run as root after `make build`: go run ./bench/k8s/reach [-adds 20] [-present 1000].
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/bench/internal/kurmanode"
	"kurma.dev/kurma/internal/kube/cnid"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	capi "kurma.dev/kurma/pkg/controllerapi"
)

const (
	ctlAddr  = "127.0.0.1:19699"
	ctlToken = "kbench-reach"
	nsName   = "default"
	// echoPort is the echo image's TCP port; svcPort the Services'.
	echoPort = 8080
	svcPort  = 80
)

func main() {
	adds := flag.Int("adds", 20, "Services created one at a time and timed")
	present := flag.Int("present", 1000, "Services (same backends) created before the timed adds")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/k8s/reach: needs root")
		os.Exit(1)
	}
	if err := run(context.Background(), *adds, *present); err != nil {
		fmt.Fprintf(os.Stderr, "bench/k8s/reach: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, adds, present int) (err error) {
	binDir := kubecluster.BinDir()
	if err := kurmanode.Check(binDir); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "kbench-reach")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	plugins := filepath.Join(tmp, "cni-bin")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join(binDir, "kurma-k8s"), filepath.Join(plugins, "kurma-k8s")); err != nil {
		return err
	}
	node := &kurmanode.Node{Socket: filepath.Join(tmp, "sock", "cni.sock"), CtlAddr: ctlAddr, Token: ctlToken,
		WatcherArgs: []string{"--service-cidr", kubecluster.ServiceCIDR}}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(sctx, kubecluster.Options{BinDir: binDir, ControllerManager: true,
		CNIConfList: kurmanode.ConfList(node.Socket), CNIBinDir: plugins})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := node.Start(ctx, c); err != nil {
		return err
	}
	ctx, cancel = context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	pods := c.Client.CoreV1().Pods(nsName)
	// The pods go before the agent does (Close stops it first), and
	// Close waits until the kubelet tore every sandbox down, so each
	// sandbox's DEL reaches the agent.
	defer func() {
		if derr := drain(context.WithoutCancel(ctx), c, node); derr != nil && err == nil {
			err = derr
		}
	}()

	backends := map[string]bool{"web-0": true, "web-1": true}
	for _, name := range []string{"web-0", "web-1", "client"} {
		role := "web"
		if name == "client" {
			role = "client"
		}
		if _, err := pods.Create(ctx, pod(name, role, c.NodeName), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	running, err := c.WaitPodsRunning(ctx, nsName, "bench=reach", 3)
	if err != nil {
		return err
	}
	var client corev1.Pod
	for _, p := range running {
		if p.Name == "client" {
			client = p
		}
	}
	netnsPath, err := cnid.PodNetNS(filepath.Join(node.StateDir, "k8s"), string(client.UID))
	if err != nil {
		return err
	}

	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}}
	ctl, err := capi.New("http://"+ctlAddr, capi.WithToken(ctlToken), capi.WithHTTPClient(hc))
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := createPresent(ctx, c, present); err != nil {
		return err
	}
	if err := waitLBs(ctx, ctl, present); err != nil {
		return err
	}
	fmt.Printf("%d Services present (2 endpoints each), all with their members at the controller after %.1f s\n",
		present, time.Since(t0).Seconds())

	var took benchutil.Samples
	for i := range adds {
		svc, err := c.Client.CoreV1().Services(nsName).Create(ctx, service(fmt.Sprintf("reach-%03d", i)), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		start := time.Now()
		addr := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svcPort))
		if err := probe(ctx, netnsPath, addr, backends, 30*time.Second); err != nil {
			return fmt.Errorf("service %s (%s): %w", svc.Name, addr, err)
		}
		took = append(took, time.Since(start))
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", benchutil.Ms(d)) }
	fmt.Printf("Service created (API write returned) → a pod's TCP connection to its clusterIP answered by a backend, %d adds with %d present:\n", adds, present)
	fmt.Printf("  p50 %s, p99 %s, max %s (goal p99 ≤ 1 s: %.3f× of it)\n",
		ms(took.Pct(0.5)), ms(took.Pct(0.99)), ms(took.Pct(1)), took.Pct(0.99).Seconds())
	return nil
}

// drain deletes the bench's pods and waits until the kubelet has torn
// their sandboxes down through the agent.
func drain(ctx context.Context, c *kubecluster.Cluster, node *kurmanode.Node) error {
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(nsName).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: "bench=reach"}); err != nil {
		return err
	}
	return node.WaitDrained(ctx, 2*time.Minute)
}

// pod is an echo pod on node, labelled for the bench and its role.
func pod(name, role, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": "reach", "role": role}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever}}},
	}
}

// service is a ClusterIP Service in front of the web pods.
func service(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": "reach"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"role": "web"},
			Ports: []corev1.ServicePort{{Name: "echo", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(echoPort)}}},
	}
}

// createPresent creates n Services, 16 at a time.
func createPresent(ctx context.Context, c *kubecluster.Cluster, n int) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := c.Client.CoreV1().Services(nsName).Create(ctx, service(fmt.Sprintf("present-%05d", i)), metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitLBs waits until n load balancers of the bench's Services have both
// members at the controller.
func waitLBs(ctx context.Context, ctl *capi.Client, n int) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := 0
	for {
		lbs, err := ctl.ListLoadBalancers(ctx, "k8s")
		if err == nil {
			last = 0
			for _, lb := range lbs {
				if strings.Contains(lb.Name, "present-") && len(lb.Members) == 2 {
					last++
				}
			}
			if last >= n {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d load balancers with their members: %w", last, n, ctx.Err())
		}
	}
}

// probe dials addr from inside netnsPath until one of backends answers
// "hostname", or limit passes.
func probe(ctx context.Context, netnsPath, addr string, backends map[string]bool, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			got, err := ask(addr)
			if err == nil && backends[got] {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("answered %q", got)
			}
			last = err
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	if err != nil {
		return errors.Join(err, last)
	}
	return nil
}

// ask sends "hostname" to addr over TCP from the calling thread's
// namespace and returns the answer.
func ask(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 25*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "hostname\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}
