package k8se2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestForgedAnnotation is issue 25's port hijack, tried as a namespace
// editor would: a pod of namespace fb, held by a scheduling gate, is given
// a copy of the annotation of a pod of namespace fa (only pod_uid changed
// to its own), then ungated. With the watcher up, the attacker ends with a
// port of its own; with the watcher down, its sandbox gets the driver's
// CNI error 106. Either way the victim keeps its address and its traffic.
// Last, an ADD of the victim's own pod into another namespace (a second
// sandbox while the first is alive) is refused by the agent and leaves the
// victim plugged.
func TestForgedAnnotation(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{ControllerManager: true, Scheduler: true})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	kc := e.C.Client
	w := e.StartWatcher("--resync", "5s")
	a1 := e.StartAgentAt(e.C.NodeName, "10.253.0.1", sock, "--k8s-annotation-timeout", "3s")
	t.Cleanup(func() { removePodsOf(t, e, a1, "fa", "fb") })
	e.Namespace("fa")
	e.Namespace("fb")
	for _, p := range []*corev1.Pod{kubetest.Pod("fa", "victim", e.C.NodeName), kubetest.Pod("fa", "client", e.C.NodeName)} {
		p.Labels["role"] = p.Name
		if _, err := kc.CoreV1().Pods("fa").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := e.C.WaitPodsRunning(ctx, "fa", "app=kubetest", 2)
	if err != nil {
		t.Fatal(err)
	}
	var victim, client corev1.Pod
	for _, p := range ps {
		if p.Name == "victim" {
			victim = p
		} else {
			client = p
		}
	}
	clientNS := a1.PodNetNS(t, client)
	reachPod(t, clientNS, victim)
	vAnn := victim.Annotations[podnet.Annotation]

	forge := func(name string) {
		t.Helper()
		p := kubetest.Pod("fb", name, "")
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kurma.dev/test-gate"}}
		p, err := kc.CoreV1().Pods("fb").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nets, err := podnet.Decode(vAnn)
		if err != nil {
			t.Fatal(err)
		}
		n := nets[podnet.DefaultNetwork]
		n.PodUID = string(p.UID)
		nets[podnet.DefaultNetwork] = n
		forged, err := podnet.Encode(nets)
		if err != nil {
			t.Fatal(err)
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{podnet.Annotation: forged}}})
		if _, err := kc.CoreV1().Pods("fb").Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		ungate := []byte(`{"spec":{"schedulingGates":null}}`)
		if _, err := kc.CoreV1().Pods("fb").Patch(ctx, name, types.StrategicMergePatchType, ungate, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	victimKeeps := func(what string) {
		t.Helper()
		for range 6 {
			got, err := askHostname(clientNS, victim.Status.PodIP+":8080")
			if err != nil || got != "victim" {
				t.Fatalf("%s: %s answered %q, %v; want the victim", what, victim.Status.PodIP, got, err)
			}
		}
	}

	// Watcher up: the watcher rewrites the annotation, the attacker gets
	// its own port (the driver never plugs the forged one meanwhile).
	forge("attacker-up")
	e.Eventually(90*time.Second, "attacker-up Running", func() error {
		p, err := kc.CoreV1().Pods("fb").Get(ctx, "attacker-up", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.PodIP == victim.Status.PodIP {
			t.Fatalf("attacker-up has the victim's address %s", p.Status.PodIP)
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
		}
		return nil
	})
	victimKeeps("watcher up")

	// Watcher down (as during its failover): nothing rewrites the forged
	// annotation; the driver refuses it.
	w.Stop(5 * time.Second)
	forge("attacker-down")
	e.Eventually(90*time.Second, "CNI error 106 for attacker-down", func() error {
		evs, err := kc.CoreV1().Events("fb").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=attacker-down"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "FailedCreatePodSandBox" && strings.Contains(ev.Message, "another pod's port") {
				return nil
			}
		}
		return fmt.Errorf("no sandbox failure naming another pod's port among %d events", len(evs.Items))
	})
	if p, err := kc.CoreV1().Pods("fb").Get(ctx, "attacker-down", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Status.Phase == corev1.PodRunning || p.Status.PodIP == victim.Status.PodIP {
		t.Fatalf("attacker-down is %s with address %q", p.Status.Phase, p.Status.PodIP)
	}
	victimKeeps("watcher down")

	// The agent's own check: the victim's port, asked for a second sandbox
	// while the first is alive, stays where it is.
	other := testutil.NewNetNS(t)
	add := kubetest.Cnitool(t, ctx, sock, other.Path(), "fa", "victim", testutil.UniqueName("cid"), string(victim.UID))
	if out, err := add("add"); err == nil || !strings.Contains(out, "still exists") {
		t.Fatalf("ADD of the victim's port into a second sandbox: %v\n%s", err, out)
	}
	victimKeeps("second sandbox refused")
}

// removePodsOf deletes the namespaces' pods and waits until the agent has
// forgotten their attachments (before it stops).
func removePodsOf(t *testing.T, e *kubetest.Env, a *kubetest.Agent, nss ...string) {
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range nss {
		_ = e.C.Client.CoreV1().Namespaces().Delete(cctx, ns, metav1.DeleteOptions{})
	}
	for cctx.Err() == nil {
		ps, err := e.C.Client.CoreV1().Pods("").List(cctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + e.C.NodeName})
		recs, _ := os.ReadDir(filepath.Join(a.StateDir, "k8s"))
		if err == nil && len(ps.Items) == 0 && len(recs) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("pods of the node not gone before the agent stops")
}
