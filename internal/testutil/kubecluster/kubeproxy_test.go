package kubecluster_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestServiceThroughKubeProxy runs kube-proxy (nftables) on the node: a
// ClusterIP Service in front of a Deployment of 2 answers over TCP and UDP
// from the node's namespace, from both pods.
func TestServiceThroughKubeProxy(t *testing.T) {
	c := kubecluster.StartT(t, kubecluster.Options{
		ControllerManager: true,
		Scheduler:         true,
		CNIConfList:       kubecluster.BridgeConfList("kkcbr1", "10.244.8.0/24", t.TempDir()),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	const closeWait = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	hostCloseWait, err := os.ReadFile(closeWait)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartKubeProxy(ctx); err != nil {
		t.Fatal(err)
	}
	// kube-proxy sets its node's CLOSE_WAIT timeout (1 h, as the upstream
	// spec "KubeProxy should set TCP CLOSE_WAIT timeout" checks), in the
	// node's namespace only.
	if out, err := c.Command(ctx, "cat", closeWait).Output(); err != nil || strings.TrimSpace(string(out)) != "3600" {
		t.Errorf("node's CLOSE_WAIT timeout = %q (%v), want 3600", out, err)
	}
	if now, err := os.ReadFile(closeWait); err != nil || string(now) != string(hostCloseWait) {
		t.Errorf("host's CLOSE_WAIT timeout = %q (%v), was %q", now, err, hostCloseWait)
	}
	replicas := int32(2)
	labels := map[string]string{"app": "svc-echo"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "svc-echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever,
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svc-echo"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			},
		},
	}
	svc, err = c.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPodsRunning(ctx, "default", "app=svc-echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{pods[0].Name: true, pods[1].Name: true}
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	for _, proto := range []string{"tcp", "udp"} {
		// kube-proxy programs the Service once its EndpointSlice lists
		// ready endpoints; ask until both pods have answered.
		seen := map[string]bool{}
		var last string
		for len(seen) < 2 {
			got, err := ask(ctx, c, proto, vip, "hostname")
			switch {
			case err != nil:
				last = err.Error()
			case !names[got]:
				t.Fatalf("%s %s answered %q, not a pod of the Service", proto, vip, got)
			default:
				seen[got] = true
			}
			if ctx.Err() != nil {
				t.Fatalf("%s %s: answered by %v of 2 pods (last error: %s)\nkube-proxy:\n%s", proto, vip,
					keys(seen), last, c.Logs("kube-proxy", 3000))
			}
			if len(seen) < 2 {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	out, err := c.Command(ctx, "nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
	if err != nil || !strings.Contains(string(out), svc.Spec.ClusterIP) {
		t.Errorf("kube-proxy's table lacks %s: %v\n%s", svc.Spec.ClusterIP, err, out)
	}
}

func keys(m map[string]bool) string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	return fmt.Sprint(s)
}
