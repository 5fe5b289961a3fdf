// Command watcherrss measures the memory of kurma-k8s-watcher's pod cache:
// the watcher's RSS once its informers have synced N pods, with whole Pod
// objects cached (--cache-full-pods, what the watcher did before) and with
// the compact records it caches now, in the same run against the same
// kube-apiserver + etcd (internal/testutil/kubecluster, no node). The pods
// are Pod objects bound by nodeName to a Node object with no kubelet (they
// never run); each has a container with a few env vars, resources, three
// labels and two annotations, smaller than a running pod (no status).
// The watcher is given no controller: it syncs its caches, then waits in
// its setup, so only the caches count.
//
// Run as root after `make build`: go run ./bench/k8s/watcherrss [-pods 10000].
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

func main() {
	n := flag.Int("pods", 10000, "pods in the cluster")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "watcherrss:", err)
		os.Exit(1)
	}
}

func pod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%05d", i), Namespace: "rss",
			Labels:      map[string]string{"app": "web", "tier": "frontend", "pod-template-hash": "7d4b9c8f6d"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-29T06:00:00Z", "owner": "team-a"}},
		Spec: corev1.PodSpec{NodeName: "fake-node", Containers: []corev1.Container{{
			Name: "web", Image: "registry.example/web:1.2.3", ImagePullPolicy: corev1.PullIfNotPresent,
			Ports: []corev1.ContainerPort{{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			Env: []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "LOG_LEVEL", Value: "info"},
				{Name: "LISTEN", Value: ":8080"}, {Name: "CACHE_SIZE", Value: "256"}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
		}}},
	}
}

func run(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(ctx, kubecluster.Options{NoNode: true})
	if err != nil {
		return err
	}
	defer c.Close()
	kc := c.Client
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "fake-node"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rss"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				if _, err := kc.CoreV1().Pods("rss").Create(ctx, pod(i), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	fmt.Printf("%d pods created in %.1fs\n", n, time.Since(start).Seconds())
	full, err := measure(ctx, c, "full", true)
	if err != nil {
		return err
	}
	compact, err := measure(ctx, c, "compact", false)
	if err != nil {
		return err
	}
	fmt.Printf("watcher with %d pods cached   RSS MB   peak (VmHWM) MB\n", n)
	fmt.Printf("  whole Pod objects (before)   %6.1f   %6.1f\n", full[0], full[1])
	fmt.Printf("  compact pods (now)           %6.1f   %6.1f\n", compact[0], compact[1])
	fmt.Printf("  ratio compact/full           %6.2f   %6.2f\n", compact[0]/full[0], compact[1]/full[1])
	return nil
}

// measure starts a watcher, waits until its informers have synced, lets it
// settle, and returns its RSS and peak RSS in MB.
func measure(ctx context.Context, c *kubecluster.Cluster, name string, full bool) ([2]float64, error) {
	args := []string{"--kubeconfig", c.Kubeconfig, "--controller", "http://127.0.0.1:1", "--metrics-listen", ""}
	if full {
		args = append(args, "--cache-full-pods")
	}
	p, err := c.StartProcess("watcher-"+name, exec.Command(filepath.Join(kubecluster.BinDir(), "kurma-k8s-watcher"), args...))
	if err != nil {
		return [2]float64{}, err
	}
	defer p.Stop(5 * time.Second)
	deadline := time.Now().Add(5 * time.Minute)
	for !strings.Contains(c.Logs(p.Name, 1<<20), "setup failed") {
		if time.Now().After(deadline) {
			return [2]float64{}, fmt.Errorf("watcher %s: caches not synced in 5 min:\n%s", name, c.Logs(p.Name, 3000))
		}
		select {
		case <-p.Done():
			return [2]float64{}, fmt.Errorf("watcher %s exited: %v\n%s", name, p.Err(), c.Logs(p.Name, 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	// Setup runs after the caches synced; give the GC a few cycles.
	time.Sleep(5 * time.Second)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID()))
	if err != nil {
		return [2]float64{}, err
	}
	var out [2]float64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			out[0] = kb / 1024
		case "VmHWM:":
			out[1] = kb / 1024
		}
	}
	return out, nil
}
