package kubecluster_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// sweepChildEnv makes the test binary run sweepChild instead of the test.
const sweepChildEnv = "KURMA_KUBECLUSTER_SWEEP_CHILD"

// TestSweepAfterKill kills -9 a test binary that runs a cluster with a pod
// and checks that the next cluster's Start undoes what it left: the pod's
// sandbox (its address is released by a CNI DEL), shims, cgroups, mounts,
// namespace and folder.
func TestSweepAfterKill(t *testing.T) {
	if leases := os.Getenv(sweepChildEnv); leases != "" {
		sweepChild(t, leases)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test runs as root)")
	}
	leases := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSweepAfterKill$", "-test.v")
	child.Env = append(os.Environ(), sweepChildEnv+"="+leases)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, nsPath, cg, sock string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 5 && f[0] == "CLUSTER" {
			dir, nsPath, cg, sock = f[1], f[2], f[3], f[4]
			break
		}
	}
	if dir == "" {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatalf("child cluster did not come up")
	}
	_ = child.Process.Signal(syscall.SIGKILL)
	go func() { _, _ = bufio.NewReader(out).WriteTo(nopWriter{}) }()
	_ = child.Wait()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the killed cluster's folder is already gone: %v", err)
	}
	if ips := leasedIPs(t, filepath.Join(leases, "kurma-test-bridge")); len(ips) != 1 {
		t.Fatalf("the killed cluster's pod holds leases %v, want one", ips)
	}

	c := kubecluster.StartT(t, kubecluster.Options{NoNode: true})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if ips := leasedIPs(t, filepath.Join(leases, "kurma-test-bridge")); len(ips) != 0 {
		t.Errorf("the sweep left the pod's leases %v (no CNI DEL)", ips)
	}
	assertGone(t, dir, nsPath, cg, sock, nil)
}

// sweepChild runs a cluster with one pod, prints its paths and waits to
// be killed.
func sweepChild(t *testing.T, leases string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := kubecluster.Start(ctx, kubecluster.Options{
		CNIConfList: kubecluster.BridgeConfList("kkcsw0", "10.244.9.0/24", leases),
	})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Labels: map[string]string{"app": "orphan"}},
		Spec: corev1.PodSpec{NodeName: c.NodeName, Containers: []corev1.Container{{
			Name: "echo", Image: kubecluster.EchoImage, ImagePullPolicy: corev1.PullNever}}},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitPodsRunning(ctx, "default", "app=orphan", 1); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CLUSTER %s %s %s %s\n", c.Dir, c.NetNS, c.CgroupRoot, c.ContainerdSocket)
	<-ctx.Done()
}

type nopWriter struct{}

func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }
