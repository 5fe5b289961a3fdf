package services

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"kurma.dev/kurma/internal/kube/podnet"
)

// The informers' transforms replace each Service and EndpointSlice by a
// compact record of what desired, sync and setStatus read (svcObj,
// sliceObj) before it is cached: the caches hold every Service and
// EndpointSlice of the cluster, and a decoded object with its metadata,
// label map and unused fields is several times larger. A sync turns the
// record back into a Service or slice holding those fields only
// (service, slice), which nothing writes back whole: status goes out as
// a patch (patchStatus). The transforms pass records through unchanged,
// so they may run twice on one object.

// objMeta is the metadata both records keep; GetObjectMeta lets the
// informer's store key and index them as it would the objects.
type objMeta struct {
	ns, name, rv string
	uid          types.UID
	gen          int64
}

func metaOf(m *metav1.ObjectMeta) objMeta {
	return objMeta{ns: m.Namespace, name: m.Name, rv: m.ResourceVersion, uid: m.UID, gen: m.Generation}
}

// GetObjectMeta implements metav1.ObjectMetaAccessor (for the store's key
// function).
func (m *objMeta) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: m.ns, Name: m.name, ResourceVersion: m.rv, UID: m.uid, Generation: m.gen}
}

func (m *objMeta) objectMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: m.ns, Name: m.name, ResourceVersion: m.rv, UID: m.uid, Generation: m.gen}
}

func (m *objMeta) key() string { return m.ns + "/" + m.name }

// svcObj is the cached record of a Service.
type svcObj struct {
	objMeta
	typ        corev1.ServiceType
	clusterIP  string
	clusterIPs []string // only when more than ClusterIP (dual stack)
	ports      []corev1.ServicePort
	affinity   corev1.ServiceAffinity
	affTimeout *int32
	lbClass    *string
	lbIP       string
	status     *corev1.ServiceStatus // nil when empty (a ClusterIP Service's)
	// The traffic policies and host-level frontends.
	externalIPs []string
	etp         corev1.ServiceExternalTrafficPolicy
	itp         *corev1.ServiceInternalTrafficPolicy
	hcNodePort  int32
	// proxyLabels are the labels that take a Service from us
	// (LabelServiceProxyName, LabelHeadless), nil when it has none.
	proxyLabels map[string]string
}

// sliceObj is the cached record of an EndpointSlice.
type sliceObj struct {
	objMeta
	service  string // its kubernetes.io/service-name label
	addrType discoveryv1.AddressType
	ports    []slicePort
	eps      []sliceEndpoint
}

// slicePort is an EndpointPort without its pointers (nil Name and
// Protocol read as "" and TCP, as desired reads them).
type slicePort struct {
	name    string
	proto   corev1.Protocol
	port    int32
	hasPort bool
}

// sliceEndpoint is an endpoint's first address, its conditions, its node
// and the uid of the Pod it targets.
type sliceEndpoint struct {
	addr                        string
	ready, serving, terminating *bool
	node                        string
	pod                         types.UID
}

// The values of a few enumerated fields, so that records share one copy
// instead of each keeping the decoder's.
var (
	serviceTypes = []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeLoadBalancer,
		corev1.ServiceTypeNodePort, corev1.ServiceTypeExternalName}
	affinities = []corev1.ServiceAffinity{corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP}
	etps       = []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster,
		corev1.ServiceExternalTrafficPolicyLocal}
	protocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}

	addressTypes = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6,
		discoveryv1.AddressTypeFQDN}
)

// intern returns the element of known equal to v, else v.
func intern[T ~string](v T, known []T) T {
	for _, k := range known {
		if k == v {
			return k
		}
	}
	return v
}

// compactService is the Service informer's transform.
func compactService(obj any) (any, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	sp := &s.Spec
	o := &svcObj{objMeta: metaOf(&s.ObjectMeta), typ: intern(sp.Type, serviceTypes), clusterIP: sp.ClusterIP,
		affinity: intern(sp.SessionAffinity, affinities), lbClass: sp.LoadBalancerClass, lbIP: sp.LoadBalancerIP,
		externalIPs: sp.ExternalIPs, etp: intern(sp.ExternalTrafficPolicy, etps), itp: sp.InternalTrafficPolicy,
		hcNodePort: sp.HealthCheckNodePort}
	for _, l := range []string{LabelServiceProxyName, LabelHeadless} {
		if v, ok := s.Labels[l]; ok {
			if o.proxyLabels == nil {
				o.proxyLabels = map[string]string{}
			}
			o.proxyLabels[l] = v
		}
	}
	if len(s.Status.LoadBalancer.Ingress) > 0 || len(s.Status.Conditions) > 0 {
		st := s.Status // a copy: a pointer into s would keep all of s
		o.status = &st
	}
	if len(sp.ClusterIPs) > 1 || (len(sp.ClusterIPs) == 1 && sp.ClusterIPs[0] != sp.ClusterIP) {
		o.clusterIPs = sp.ClusterIPs
	}
	if c := sp.SessionAffinityConfig; c != nil && c.ClientIP != nil {
		o.affTimeout = c.ClientIP.TimeoutSeconds
	}
	if len(sp.Ports) > 0 {
		o.ports = make([]corev1.ServicePort, len(sp.Ports))
		for i, p := range sp.Ports {
			o.ports[i] = corev1.ServicePort{Name: p.Name, Protocol: intern(p.Protocol, protocols), Port: p.Port,
				TargetPort: p.TargetPort, NodePort: p.NodePort}
		}
	}
	return o, nil
}

// service rebuilds the Service from its record.
func (o *svcObj) service() *corev1.Service {
	s := &corev1.Service{ObjectMeta: o.objectMeta(), Spec: corev1.ServiceSpec{
		Type: o.typ, ClusterIP: o.clusterIP, ClusterIPs: o.clusterIPs, Ports: o.ports, SessionAffinity: o.affinity,
		LoadBalancerClass: o.lbClass, LoadBalancerIP: o.lbIP, ExternalIPs: o.externalIPs,
		ExternalTrafficPolicy: o.etp, InternalTrafficPolicy: o.itp, HealthCheckNodePort: o.hcNodePort,
	}}
	if o.status != nil {
		s.Status = *o.status
	}
	s.Labels = o.proxyLabels
	if o.affTimeout != nil {
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: o.affTimeout}}
	}
	return s
}

// compactSlice is the EndpointSlice informer's transform.
func compactSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	o := &sliceObj{objMeta: metaOf(&s.ObjectMeta), service: s.Labels[discoveryv1.LabelServiceName],
		addrType: intern(s.AddressType, addressTypes)}
	// As kube-proxy, a slice labelled for another proxy or headless
	// belongs to no Service we serve.
	for _, l := range []string{LabelServiceProxyName, LabelHeadless} {
		if _, ok := s.Labels[l]; ok {
			o.service = ""
		}
	}
	if len(s.Ports) > 0 {
		o.ports = make([]slicePort, len(s.Ports))
		for i, p := range s.Ports {
			o.ports[i] = slicePort{name: strp(p.Name), proto: intern(ptrProto(p.Protocol), protocols)}
			if p.Port != nil {
				o.ports[i].port, o.ports[i].hasPort = *p.Port, true
			}
		}
	}
	if len(s.Endpoints) > 0 {
		o.eps = make([]sliceEndpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			if len(e.Addresses) > 0 {
				o.eps[i].addr = e.Addresses[0]
			}
			o.eps[i].ready, o.eps[i].serving, o.eps[i].terminating = e.Conditions.Ready, e.Conditions.Serving, e.Conditions.Terminating
			o.eps[i].node = strp(e.NodeName)
			if r := e.TargetRef; r != nil && r.Kind == "Pod" {
				o.eps[i].pod = r.UID
			}
		}
	}
	return o, nil
}

// slice rebuilds the EndpointSlice from its record.
func (o *sliceObj) slice() *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: o.objectMeta(), AddressType: o.addrType}
	for _, p := range o.ports {
		ep := discoveryv1.EndpointPort{Name: &p.name, Protocol: &p.proto}
		if p.hasPort {
			ep.Port = &p.port
		}
		s.Ports = append(s.Ports, ep)
	}
	if o.service != "" {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: o.service}
	}
	s.Endpoints = make([]discoveryv1.Endpoint, len(o.eps))
	for i, e := range o.eps {
		ep := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving,
			Terminating: e.terminating}}
		if e.node != "" {
			ep.NodeName = &e.node
		}
		if e.addr != "" {
			ep.Addresses = []string{e.addr}
		}
		if e.pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", UID: e.pod}
		}
		s.Endpoints[i] = ep
	}
	return s
}

// nodeObj is the cached record of a Node: its name and the host id its
// agent announced (empty: the name).
type nodeObj struct {
	objMeta
	hostID string
}

// compactNode is the Node informer's transform.
func compactNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	o := &nodeObj{objMeta: metaOf(&n.ObjectMeta)}
	if id := n.Annotations[podnet.HostIDAnnotation]; id != n.Name {
		o.hostID = id
	}
	return o, nil
}

// nodeOf unwraps a tombstone.
func nodeOf(o any) *nodeObj {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	n, _ := o.(*nodeObj)
	return n
}
