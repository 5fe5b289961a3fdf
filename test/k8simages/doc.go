// Package k8simages holds the programs of the offline images that the
// real-cluster tests and benchmarks run under a kubelet: pause (the pod
// sandbox) and echo (a small TCP/UDP/HTTP test app). No registry is
// reachable from the test machines, so hack/build-images.sh builds each as a
// static binary and packs it as an image tarball (bin/images/k8s-*.tar),
// which internal/testutil/kubecluster imports into its containerd.
//
// The programs import nothing from Kurma.
package k8simages
