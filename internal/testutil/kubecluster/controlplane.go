package kubecluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// startControlPlane writes the credentials and runs etcd, kube-apiserver
// and the controllers asked for, and waits until the API server is ready.
func (c *Cluster) startControlPlane(ctx context.Context, opts Options) error {
	pki := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	c.Token = randHex(16)
	tokens := filepath.Join(pki, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.Token+",kurma-admin,kurma-admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	saKey := filepath.Join(pki, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return err
	}
	server := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, server); err != nil {
		return err
	}
	c.Config = &rest.Config{
		Host:            server,
		BearerToken:     c.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            c.DialContext,
		QPS:             200,
		Burst:           400,
	}
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	c.Client = cs

	bin := func(n string) string { return filepath.Join(opts.BinDir, n) }
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeerPort)
	if _, err := c.startDaemon("etcd", exec.Command(bin("tools/etcd"),
		"--name=default", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync", "--log-level=warn")); err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver-certs"),
		"--token-auth-file=" + tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
	}
	if opts.Nodes > 1 && !opts.PublicAPIServer {
		// The other nodes reach it at NodeIP, over the underlay; its
		// self-signed certificate must name that address too (pods
		// that verify it: a CNI agent told the API server's address).
		args[1], args[2] = "--bind-address=0.0.0.0", "--advertise-address="+NodeIP
	}
	if opts.PublicAPIServer {
		args[1], args[2] = "--bind-address=0.0.0.0", "--advertise-address="+NodeIP
		args = append(args, "--endpoint-reconciler-type=lease",
			"--kubelet-preferred-address-types=InternalIP,Hostname")
	} else {
		// No endpoint reconciler: there is no real master address to
		// publish.
		args = append(args, "--endpoint-reconciler-type=none")
	}
	if !opts.ServiceAccounts && !opts.PublicAPIServer {
		// Pods get no token: no controller needs to make accounts.
		args = append(args, "--disable-admission-plugins=ServiceAccount")
	}
	apiserver, err := c.startDaemon("kube-apiserver", exec.Command(bin("k8s/kube-apiserver"), append(args, opts.APIServerArgs...)...))
	if err != nil {
		return err
	}
	if err := c.waitAPIServer(ctx, apiserver); err != nil {
		return err
	}
	if opts.ControllerManager {
		// --root-ca-file: the API server's self-signed certificate,
		// published as kube-root-ca.crt for pods with service accounts.
		if _, err := c.startDaemon("kube-controller-manager", exec.Command(bin("k8s/kube-controller-manager"),
			"--kubeconfig="+c.Kubeconfig, "--authentication-kubeconfig="+c.Kubeconfig,
			"--authorization-kubeconfig="+c.Kubeconfig, "--leader-elect=false",
			"--bind-address=127.0.0.1", "--secure-port=10257",
			"--cert-dir="+filepath.Join(c.Dir, "kcm-certs"),
			"--service-account-private-key-file="+saKey, "--use-service-account-credentials=false",
			"--root-ca-file="+filepath.Join(c.Dir, "apiserver-certs", "apiserver.crt"),
			"--service-cluster-ip-range="+ServiceCIDR, "--allocate-node-cidrs=false",
			"--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
			"--kube-api-qps=200", "--kube-api-burst=400")); err != nil {
			return err
		}
	}
	if opts.Scheduler {
		if _, err := c.startDaemon("kube-scheduler", exec.Command(bin("k8s/kube-scheduler"),
			"--kubeconfig="+c.Kubeconfig, "--authentication-kubeconfig="+c.Kubeconfig,
			"--authorization-kubeconfig="+c.Kubeconfig, "--leader-elect=false",
			"--bind-address=127.0.0.1", "--secure-port=10259",
			"--cert-dir="+filepath.Join(c.Dir, "scheduler-certs"))); err != nil {
			return err
		}
	}
	return nil
}

// writeKubeconfig writes an admin kubeconfig (the static token) for the
// API server at server.
func (c *Cluster) writeKubeconfig(path, server string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kurma-test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: kurma-test
  context: {cluster: kurma-test, user: admin}
current-context: kurma-test
`, server, c.Token)
	return os.WriteFile(path, []byte(kc), 0o600)
}

// waitAPIServer polls /readyz until it answers 200.
func (c *Cluster) waitAPIServer(ctx context.Context, p *Process) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	rc := c.Client.Discovery().RESTClient()
	for {
		var code int
		res := rc.Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
		if res.Error() == nil && code == http.StatusOK {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("kube-apiserver exited (%v):\n%s", p.Err(), c.Logs("kube-apiserver", 4000))
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %v (last: %v):\n%s", ctx.Err(), res.Error(),
				c.Logs("kube-apiserver", 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeRSAKey writes a fresh RSA key (PKCS#1 PEM) for service accounts.
func writeRSAKey(path string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	return os.WriteFile(path, b, 0o600)
}
