package netpol

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestCompactObjects: the informers' transforms drop what the engine never
// reads (managed fields, annotations) and keep what it does, so that an
// engine fed the compact objects computes what one fed the full objects
// does.
func TestCompactObjects(t *testing.T) {
	meta := func(ns, name string, lbl map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + name), ResourceVersion: "7", Generation: 3, Labels: lbl,
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"big":"copy"}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}}
	}
	full := pol("a", "p", sel("app", "web"), networkingv1.NetworkPolicySpec{
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "y")}},
			Ports: []networkingv1.NetworkPolicyPort{tcp(8080)}}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}})
	full.ObjectMeta = meta("a", "p", map[string]string{"owner": "x"})
	nsFull := &corev1.Namespace{ObjectMeta: meta("", "b", map[string]string{"team": "y", "kubernetes.io/metadata.name": "b"})}

	o, err := compactPolicy(full)
	if err != nil {
		t.Fatal(err)
	}
	cp := o.(*networkingv1.NetworkPolicy)
	if cp.ManagedFields != nil || cp.Annotations != nil || cp.Labels != nil {
		t.Fatalf("compact policy keeps %+v", cp.ObjectMeta)
	}
	if cp.Namespace != "a" || cp.Name != "p" || cp.UID != full.UID || cp.ResourceVersion != "7" || cp.Generation != 3 ||
		!reflect.DeepEqual(cp.Spec, full.Spec) {
		t.Fatalf("compact policy lost what is read: %+v", cp)
	}
	o, err = compactNamespace(nsFull)
	if err != nil {
		t.Fatal(err)
	}
	cn := o.(*corev1.Namespace)
	if cn.ManagedFields != nil || cn.Annotations != nil || cn.Name != "b" || cn.ResourceVersion != "7" ||
		!reflect.DeepEqual(cn.Labels, nsFull.Labels) {
		t.Fatalf("compact namespace: %+v", cn.ObjectMeta)
	}
	for _, o := range []any{"not an object", &corev1.Pod{}} {
		if got, _ := compactPolicy(o); got != o {
			t.Fatalf("compactPolicy(%T) changed it", o)
		}
		if got, _ := compactNamespace(o); got != o {
			t.Fatalf("compactNamespace(%T) changed it", o)
		}
	}

	run := func(np *networkingv1.NetworkPolicy, ns *corev1.Namespace) string {
		e := world(t)
		e.SetNamespace(ns.Name, ns.Labels)
		if err := e.SetPolicy(np); err != nil {
			t.Fatal(err)
		}
		e.Compute()
		r := e.Rules("a/web")
		if r == nil {
			t.Fatal("a/web has no rules")
		}
		return allows(r.Ingress)
	}
	if a, b := run(full, nsFull), run(cp, cn); a != b || a == "" {
		t.Fatalf("full objects allow %q, compact ones %q", a, b)
	}
}
