// Package k8sservices is the end-to-end proof of Kubernetes Services on a
// real cluster without kube-proxy (issue 16): kube-controller-manager
// writes the EndpointSlices, kurma-k8s-watcher --service-cidr turns
// Services into load balancers and floating IPs, and kurma-agent programs
// them; pods reach a ClusterIP over TCP and UDP, and a LoadBalancer
// Service's ingress address answers from a namespace outside the cluster.
// Tests only.
//
// Must not import: `kurma.dev/kurma/internal/controller/...`.
package k8sservices
