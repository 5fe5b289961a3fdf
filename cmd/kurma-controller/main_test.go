package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// start runs the binary and returns its listen address from the
// "controller listening" log line (a contract other tests rely on).
func start(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	bin := testutil.Bin(t, "kurma-controller")
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "controller listening" {
				addr <- m.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return cmd, a
	case <-time.After(20 * time.Second):
		t.Fatal("controller did not report its address")
	}
	return nil, ""
}

func TestServeAndGracefulShutdown(t *testing.T) {
	dir := t.TempDir()
	cmd, addr := start(t, "--listen", "127.0.0.1:0", "--store", "bolt:"+filepath.Join(dir, "c.db"))
	c, _ := capi.New("http://" + addr)
	if _, err := c.CreateProject(t.Context(), capi.Project{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	// A long poll in flight is ended by shutdown, and the process exits 0.
	if _, err := c.CreateVPC(t.Context(), "p", capi.VPC{ID: "v"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	// Restart on the same file: state survived.
	_, addr = start(t, "--listen", "127.0.0.1:0", "--store", "bolt:"+filepath.Join(dir, "c.db"))
	c, _ = capi.New("http://" + addr)
	if _, err := c.GetVPC(t.Context(), "p", "v"); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	bin := testutil.Bin(t, "kurma-controller")
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no token off loopback", []string{"--listen", "0.0.0.0:0"}, "without a token"},
		{"all interfaces", []string{"--listen", ":0"}, "without a token"},
		{"bad store", []string{"--store", "redis:x"}, "unknown backend"},
		{"cert without key", []string{"--listen", "127.0.0.1:0", "--tls-cert", "x"}, "go together"},
		{"empty token file", []string{"--token-file", filepath.Join(dir, "empty")}, "empty"},
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--store", "bolt:" + filepath.Join(dir, tt.name+".db")}, tt.args...)
			out, err := exec.Command(bin, args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !strings.Contains(string(out), tt.want) {
				t.Fatalf("err %v, output %s; want failure mentioning %q", err, out, tt.want)
			}
		})
	}
}

func TestTLSAndToken(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	tok := filepath.Join(dir, "tok")
	if err := os.WriteFile(tok, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, addr := start(t, "--listen", "127.0.0.1:0", "--store", "bolt:"+filepath.Join(dir, "c.db"),
		"--tls-cert", certFile, "--tls-key", keyFile, "--token-file", tok)
	_, port, _ := net.SplitHostPort(addr)
	url := "https://127.0.0.1:" + port
	good, _ := capi.New(url, capi.WithTLSConfig(&tls.Config{RootCAs: pool}), capi.WithToken("t0ken"))
	if _, err := good.ListProjects(t.Context()); err != nil {
		t.Fatalf("TLS with token: %v", err)
	}
	bad, _ := capi.New(url, capi.WithTLSConfig(&tls.Config{RootCAs: pool}))
	if _, err := bad.ListProjects(t.Context()); !errors.Is(err, kerrors.Unauthorized) {
		t.Fatalf("TLS without token = %v", err)
	}
	if _, err := http.Get("http://127.0.0.1:" + port + "/healthz"); err == nil {
		// Plain HTTP to a TLS port gets a 400 from Go's server, not data.
		resp, _ := http.Get("http://127.0.0.1:" + port + "/projects")
		if resp != nil && resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS port")
		}
	}
}

func selfSigned(t *testing.T, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kctl-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	cf, kf := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(cf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return cf, kf, pool
}
