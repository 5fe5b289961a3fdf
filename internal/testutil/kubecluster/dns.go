package kubecluster

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ClusterDNSIP is the kube-dns Service's clusterIP that DeployCoreDNS
// claims (give it to Options.ClusterDNS).
const ClusterDNSIP = "10.96.0.10"

// corefile serves the cluster domain from the API (pod A records too: the
// upstream DNS specs look them up) and forwards the rest to the node's
// resolvers.
const corefile = `.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    forward . /etc/resolv.conf
}
`

// DeployCoreDNS runs CoreDNS (image: a CoreDNS build whose entrypoint is
// the coredns binary) as a Deployment of replicas pods in kube-system
// behind the kube-dns Service at ClusterDNSIP, as a cluster installer
// does, and waits until every replica is ready. The pods reach the API
// server through the `kubernetes` Service with their service account's
// token: the cluster needs PublicAPIServer and a controller manager, and a
// Service proxy must serve both Services.
func (c *Cluster) DeployCoreDNS(ctx context.Context, image string, replicas int32) error {
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	kc := c.Client
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
		Data: map[string]string{"Corefile": corefile}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	probe := func(path string, port int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}},
			PeriodSeconds: 2, FailureThreshold: 5}
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{ServiceAccountName: name, DNSPolicy: corev1.DNSDefault,
					PriorityClassName: "system-cluster-critical",
					Containers: []corev1.Container{{Name: "coredns", Image: image, ImagePullPolicy: corev1.PullNever,
						Args: []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}},
						VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						ReadinessProbe: probe("/ready", 8181), LivenessProbe: probe("/health", 8080)}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}}}}}}
	if _, err := kc.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	if _, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: ClusterDNSIP, Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)}}}},
		metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		d, err := kc.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == replicas {
			return nil
		}
		select {
		case <-ctx.Done():
			pods, _ := kc.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
			var st []string
			if pods != nil {
				for _, p := range pods.Items {
					st = append(st, fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
				}
			}
			return fmt.Errorf("coredns not ready: %w (pods: %v)", ctx.Err(), st)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
