package services

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The informers' transforms keep, of each object, what desired, sync and
// setStatus read, and drop the rest (managed fields, labels and
// annotations, selectors, topology, hints…) before it is cached: the
// caches hold every Service and EndpointSlice of the cluster. They change
// the freshly decoded object in place and may run twice on one object.
// Nothing read from these caches is ever written back whole: status goes
// out as a patch (setStatus).

// slimMeta keeps name, namespace, uid, resourceVersion and generation
// (and labels when keepLabel names one, only that one).
func slimMeta(m *metav1.ObjectMeta, keepLabel string) {
	var labels map[string]string
	if v, ok := m.Labels[keepLabel]; ok && keepLabel != "" {
		if len(m.Labels) == 1 {
			labels = m.Labels
		} else {
			labels = map[string]string{keepLabel: v}
		}
	}
	*m = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, DeletionTimestamp: m.DeletionTimestamp, Labels: labels}
}

// slimService keeps the clusterIPs, type, ports, session affinity, load
// balancer class and IP, and the status.
func slimService(obj any) (any, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	slimMeta(&s.ObjectMeta, "")
	sp := s.Spec
	ports := sp.Ports
	for i := range ports {
		ports[i] = corev1.ServicePort{Name: ports[i].Name, Protocol: ports[i].Protocol, Port: ports[i].Port,
			TargetPort: ports[i].TargetPort}
	}
	s.Spec = corev1.ServiceSpec{Type: sp.Type, ClusterIP: sp.ClusterIP, Ports: ports,
		SessionAffinity: sp.SessionAffinity, SessionAffinityConfig: sp.SessionAffinityConfig,
		LoadBalancerClass: sp.LoadBalancerClass, LoadBalancerIP: sp.LoadBalancerIP}
	// ClusterIPs[0] is ClusterIP; only a dual-stack Service needs the list.
	if len(sp.ClusterIPs) > 1 || (len(sp.ClusterIPs) == 1 && sp.ClusterIPs[0] != sp.ClusterIP) {
		s.Spec.ClusterIPs = sp.ClusterIPs
	}
	return s, nil
}

// slimSlice keeps the service-name label, the address type, the ports
// and, of each endpoint, its first address, its ready condition and a
// Pod target's uid.
func slimSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	slimMeta(&s.ObjectMeta, discoveryv1.LabelServiceName)
	eps := s.Endpoints
	for i := range eps {
		e := &eps[i]
		var ref *corev1.ObjectReference
		if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.UID != "" {
			ref = &corev1.ObjectReference{Kind: r.Kind, UID: r.UID}
		}
		*e = discoveryv1.Endpoint{Addresses: e.Addresses[:min(len(e.Addresses), 1):min(len(e.Addresses), 1)],
			Conditions: discoveryv1.EndpointConditions{Ready: e.Conditions.Ready}, TargetRef: ref}
	}
	return s, nil
}
