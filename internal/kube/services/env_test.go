package services_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/services"
	"kurma.dev/kurma/internal/testutil/kubecluster"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

const (
	project  = "k8s"
	vpcID    = "k8s-pods"
	vpcCIDR  = "10.32.0.0/11"
	extNet   = "public"
	extCIDR  = "192.0.2.0/24"
	ctlAddr  = "127.0.0.1:19697"
	ctlToken = "services-test-token"
)

var svcCIDR = netip.MustParsePrefix(kubecluster.ServiceCIDR)

// env is a real API server + etcd (no node) and a real kurma-controller
// process in the cluster's namespace.
type env struct {
	t   *testing.T
	c   *kubecluster.Cluster
	ctl *capi.Client
	n   int

	logMu sync.Mutex
	logs  []string // the in-process reconcilers' log lines (Warn and up)

	r *services.Reconciler // the last one reconciler started
}

func start(t *testing.T, withExternal bool) *env {
	t.Helper()
	c := kubecluster.StartT(t, kubecluster.Options{NoNode: true})
	e := &env{t: t, c: c}
	tok := filepath.Join(c.Dir, "ctl-token")
	if err := os.WriteFile(tok, []byte(ctlToken), 0o600); err != nil {
		t.Fatal(err)
	}
	e.proc("kurma-controller", filepath.Join(c.BinDir, "kurma-controller"), "--listen", ctlAddr,
		"--store", "bolt:"+filepath.Join(c.Dir, "controller.db"), "--token-file", tok)
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return c.DialContext(ctx, network, addr)
	}, MaxIdleConnsPerHost: 64}
	ctl, err := capi.New("http://"+ctlAddr, capi.WithToken(ctlToken), capi.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	e.ctl = ctl
	ctx := context.Background()
	e.eventually(20*time.Second, "controller up", func() error {
		_, err := ctl.ListProjects(ctx)
		return err
	})
	// What internal/kube/podports makes at its start.
	if _, err := ctl.CreateProject(ctx, capi.Project{ID: project, Name: project}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.CreateVPC(ctx, project, capi.VPC{ID: vpcID, Name: vpcID, CIDR: vpcCIDR}); err != nil {
		t.Fatal(err)
	}
	if withExternal {
		e.createExternal()
	}
	return e
}

func (e *env) createExternal() {
	e.t.Helper()
	if _, err := e.ctl.CreateExternalNetwork(context.Background(), capi.ExternalNetwork{ID: extNet, Name: extNet, CIDR: extCIDR}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) proc(name, bin string, args ...string) *kubecluster.Process {
	e.t.Helper()
	e.n++
	p, err := e.c.StartProcess(name+"-"+strconv.Itoa(e.n), exec.Command(bin, args...))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("--- %s (tail) ---\n%s", p.Name, e.c.Logs(p.Name, 6000))
		}
		p.Stop(5 * time.Second)
	})
	return p
}

// reconciler runs a Reconciler in this process until the returned stop is
// called (or the test ends).
func (e *env) reconciler(resync time.Duration) (stop func()) {
	e.t.Helper()
	r, err := services.New(services.Config{Kube: e.c.Client, Controller: e.ctl, ServiceCIDR: svcCIDR,
		Resync: resync, Logger: slog.New(slog.NewTextHandler(testWriter{e}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		e.t.Fatal(err)
	}
	e.r = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	e.eventually(30*time.Second, "reconciler synced", func() error {
		select {
		case err := <-done:
			return fmt.Errorf("reconciler ended: %v", err)
		default:
		}
		if !r.Synced() {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("reconciler: %v", err)
		}
	}
	e.t.Cleanup(stop)
	return stop
}

// testWriter logs to the test and keeps each line for logCount.
type testWriter struct{ e *env }

func (w testWriter) Write(b []byte) (int, error) {
	line := strings.TrimRight(string(b), "\n")
	w.e.t.Log(line)
	w.e.logMu.Lock()
	w.e.logs = append(w.e.logs, line)
	w.e.logMu.Unlock()
	return len(b), nil
}

// logCount is the number of log lines that contain s.
func (e *env) logCount(s string) int {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	n := 0
	for _, l := range e.logs {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

func (e *env) eventually(limit time.Duration, what string, f func() error) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) namespace(name string) {
	e.t.Helper()
	_, err := e.c.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createSvc(s *corev1.Service) *corev1.Service {
	e.t.Helper()
	out, err := e.c.Client.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) deleteSvc(ns, name string) {
	e.t.Helper()
	err := e.c.Client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
}

func (e *env) getSvc(ns, name string) *corev1.Service {
	e.t.Helper()
	s, err := e.c.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// applySlice creates or replaces an EndpointSlice of a Service.
func (e *env) applySlice(s *discoveryv1.EndpointSlice) {
	e.t.Helper()
	if err := kubetest.ApplySlice(context.Background(), e.c.Client, s); err != nil {
		e.t.Fatal(err)
	}
}

func svc(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: ports}}
}

func tcp(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: target}
}

func udp(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolUDP, Port: port, TargetPort: target}
}

// endpoints is one slice of service svcName with the given ports (name ->
// number and protocol) and addresses; an address prefixed "!" is not
// ready.
func endpoints(ns, name, svcName string, ports []discoveryv1.EndpointPort, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports,
	}
	for _, a := range addrs {
		ready := !strings.HasPrefix(a, "!")
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{strings.TrimPrefix(a, "!")},
			Conditions: discoveryv1.EndpointConditions{Ready: new(ready)}})
	}
	return s
}

func eport(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: new(name), Protocol: new(proto), Port: new(port)}
}

// lbOf returns the controller's load balancer of a Service, or an error.
func (e *env) lbOf(s *corev1.Service) (*capi.LoadBalancer, error) {
	return e.ctl.GetLoadBalancer(context.Background(), project, services.LBID(s.UID))
}

// waitLB waits until the Service's load balancer satisfies check.
func (e *env) waitLB(s *corev1.Service, what string, check func(*capi.LoadBalancer) error) *capi.LoadBalancer {
	e.t.Helper()
	var lb *capi.LoadBalancer
	e.eventually(15*time.Second, what, func() error {
		var err error
		if lb, err = e.lbOf(s); err != nil {
			return err
		}
		return check(lb)
	})
	return lb
}

func (e *env) waitNoLB(s *corev1.Service, what string) {
	e.t.Helper()
	e.eventually(15*time.Second, what, func() error {
		_, err := e.lbOf(s)
		if errors.Is(err, kerrors.NotFound) {
			return nil
		}
		return fmt.Errorf("load balancer still there (%v)", err)
	})
}

// addrs lists a load balancer's member addresses, sorted, each once
// (members are per listener: one address may be a member of several).
func addrs(lb *capi.LoadBalancer) []string {
	var out []string
	for _, m := range lb.Members {
		out = append(out, m.Address)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ourFIPs lists the project's floating IPs made for Services.
func (e *env) ourFIPs() []capi.FloatingIP {
	e.t.Helper()
	fs, err := e.ctl.ListFloatingIPs(context.Background(), project)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.DeleteFunc(fs, func(f capi.FloatingIP) bool { return !strings.HasPrefix(f.ID, services.LBPrefix) })
}

func (e *env) ourLBs() []capi.LoadBalancer {
	e.t.Helper()
	ls, err := e.ctl.ListLoadBalancers(context.Background(), project)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.DeleteFunc(ls, func(l capi.LoadBalancer) bool { return !strings.HasPrefix(l.ID, services.LBPrefix) })
}

// events returns the reasons of the Events about a Service.
func (e *env) events(s *corev1.Service) []string {
	e.t.Helper()
	l, err := e.c.Client.CoreV1().Events(s.Namespace).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(s.UID)})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range l.Items {
		out = append(out, ev.Reason)
	}
	return out
}
