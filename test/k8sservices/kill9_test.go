package k8sservices_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/internal/kube/kubetest"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestKill9DuringServiceChanges: the watcher and the agent are killed with
// SIGKILL during 200 Service and EndpointSlice changes and started again;
// afterwards the agent's kernel rules (services and backends maps) match
// the API exactly: one entry per Service port at its clusterIP, the ready
// endpoints as backends, nothing else.
func TestKill9DuringServiceChanges(t *testing.T) {
	testutil.RequireRoot(t)
	e, sock := kubetest.StartWithDriver(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	kc := e.C.Client
	watcher := e.StartWatcher("--resync", "1h", "--service-cidr", kubecluster.ServiceCIDR)
	a := e.StartAgentAt(e.C.NodeName, "10.253.0.1", sock)
	t.Cleanup(func() { removePods(t, e, "k9") })
	e.Namespace("k9")
	// A pod of the VPC on this node, so that the agent programs its load
	// balancers.
	if _, err := kc.CoreV1().Pods("k9").Create(ctx, kubetest.Pod("k9", "client", e.C.NodeName), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.C.WaitPodsRunning(ctx, "k9", "app=kubetest", 1); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(7, 9))
	live := map[string]bool{}
	for i := range 200 {
		switch i {
		case 60:
			watcher.Kill()
		case 100:
			a.Proc.Kill()
		case 140:
			watcher = e.StartWatcher("--resync", "1h", "--service-cidr", kubecluster.ServiceCIDR)
			e.RestartAgent(a)
		}
		name := fmt.Sprintf("s%d", rng.IntN(30))
		switch op := rng.IntN(10); {
		case !live[name] || op < 2:
			if live[name] {
				if err := kc.CoreV1().Services("k9").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				delete(live, name)
				continue
			}
			s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8053)}}}}
			if _, err := kc.CoreV1().Services("k9").Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			live[name] = true
		default:
			sl := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports: []discoveryv1.EndpointPort{{Name: new("tcp"), Protocol: new(corev1.ProtocolTCP), Port: new(int32(8080))},
					{Name: new("udp"), Protocol: new(corev1.ProtocolUDP), Port: new(int32(8053))}},
			}
			for range rng.IntN(4) {
				sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.33.%d.%d", rng.IntN(4), 1+rng.IntN(200))},
					Conditions: discoveryv1.EndpointConditions{Ready: new(rng.IntN(5) != 0)}})
			}
			sl.Namespace = "k9"
			if err := kubetest.ApplySlice(ctx, kc, sl); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.Eventually(60*time.Second, "the agent's rules match the API", func() error {
		want, err := wantedRules(ctx, e)
		if err != nil {
			return err
		}
		got, err := kernelRules(e)
		if err != nil {
			return err
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || !slices.Equal(g, w) {
				return fmt.Errorf("%s: kernel has %v (present %v), API wants %v", k, g, ok, w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				return fmt.Errorf("stale rule for %s", k)
			}
		}
		return nil
	})
	// Now, while the restarted agent runs (its cleanup runs before the
	// one registered above).
	removePods(t, e, "k9")
}

// removePods deletes a namespace's pods and waits until the kubelet has
// removed their sandboxes (CNI DEL needs the agent, which stops after this
// cleanup).
func removePods(t *testing.T, e *kubetest.Env, namespace string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zero := int64(0)
	_ = e.C.Client.AppsV1().Deployments(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = e.C.Client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err := e.C.WaitNoPods(ctx, namespace, ""); err != nil {
		t.Errorf("pods of %s not gone: %v", namespace, err)
	}
	waitNoSandboxes(ctx, t, e)
}

// wantedRules is what the API calls for: "vip proto port" -> sorted
// ready endpoint addresses.
func wantedRules(ctx context.Context, e *kubetest.Env) (map[string][]string, error) {
	svcs, err := e.C.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sls, err := e.C.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		members := []string{}
		for _, sl := range sls.Items {
			if sl.Namespace != s.Namespace || sl.Labels[discoveryv1.LabelServiceName] != s.Name {
				continue
			}
			for _, ep := range sl.Endpoints {
				if (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && !slices.Contains(members, ep.Addresses[0]) {
					members = append(members, ep.Addresses[0])
				}
			}
		}
		slices.Sort(members)
		for _, p := range s.Spec.Ports {
			out[fmt.Sprintf("%s %s %d", s.Spec.ClusterIP, strings.ToLower(string(p.Protocol)), p.Port)] = members
		}
	}
	return out, nil
}

// kernelRules reads the agent's services and backends maps (whichever
// generation exists) with nft -j: "vip proto port" -> sorted backend
// addresses.
func kernelRules(e *kubetest.Env) (map[string][]string, error) {
	out, err := e.C.Command(context.Background(), "nft", "-j", "list", "tables").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	var tables struct {
		Nftables []map[string]struct {
			Family, Name string
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &tables); err != nil {
		return nil, err
	}
	got := map[string][]string{}
	found := false
	for _, o := range tables.Nftables {
		tb, ok := o["table"]
		if !ok || tb.Family != "inet" {
			continue
		}
		for _, gen := range []string{"a", "b"} {
			svc, err := mapElems(e, tb.Name, "services-"+gen)
			if err != nil {
				continue
			}
			found = true
			for _, kv := range svc {
				k := kv[0] // ifname vip proto port
				if len(k) < 4 {
					return nil, fmt.Errorf("services key %v", k)
				}
				id := k[1] + " " + k[2] + " " + k[3]
				if _, ok := got[id]; !ok {
					got[id] = []string{}
				}
			}
			be, err := mapElems(e, tb.Name, "backends-"+gen)
			if err != nil {
				return nil, err
			}
			for _, kv := range be {
				k, v := kv[0], kv[1]
				if len(k) < 4 || len(v) < 1 {
					return nil, fmt.Errorf("backends element %v", kv)
				}
				id := k[1] + " " + k[2] + " " + k[3]
				if !slices.Contains(got[id], v[0]) {
					got[id] = append(got[id], v[0])
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no services map in any inet table")
	}
	for k := range got {
		slices.Sort(got[k])
	}
	return got, nil
}

// mapElems lists a map's elements as [key parts, value parts].
func mapElems(e *kubetest.Env, table, name string) ([][2][]string, error) {
	out, err := e.C.Command(context.Background(), "nft", "-j", "list", "map", "inet", table, name).Output()
	if err != nil {
		return nil, err
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, err
	}
	var res [][2][]string
	for _, o := range doc.Nftables {
		raw, ok := o["map"]
		if !ok {
			continue
		}
		var m struct {
			Elem []json.RawMessage `json:"elem"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		for _, el := range m.Elem {
			var pair []any
			if err := json.Unmarshal(el, &pair); err != nil || len(pair) != 2 {
				return nil, fmt.Errorf("element %s", el)
			}
			res = append(res, [2][]string{flatten(pair[0]), flatten(pair[1])})
		}
	}
	return res, nil
}

// flatten turns a JSON element expression (a value or a concat) into
// its parts as strings.
func flatten(v any) []string {
	switch x := v.(type) {
	case map[string]any:
		if c, ok := x["concat"].([]any); ok {
			var out []string
			for _, p := range c {
				out = append(out, flatten(p)...)
			}
			return out
		}
		if el, ok := x["elem"].(map[string]any); ok {
			return flatten(el["val"])
		}
		return []string{fmt.Sprint(x)}
	case float64:
		return []string{fmt.Sprint(int64(x))}
	default:
		return []string{fmt.Sprint(x)}
	}
}
