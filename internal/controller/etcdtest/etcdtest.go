// Package etcdtest starts a real etcd server process (bin/tools/etcd, built
// by `make tools`) on loopback with a temporary data dir, for controller
// tests. Only _test.go files and benchmarks import it.
//
// Must not import internal/controller/api.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"kurma.dev/kurma/internal/testutil"
)

// Server is a running etcd.
type Server struct {
	ClientURL string
	cmd       *exec.Cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start launches etcd from binary with its data under dir and waits until
// it is healthy. The caller stops it with Stop.
func Start(ctx context.Context, binary, dir string) (*Server, error) {
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	return start(ctx, Spec{Binary: binary, Dir: dir, ClientPort: cp, PeerPort: pp})
}

// Spec describes an etcd to start with StartSpec.
type Spec struct {
	Binary, Dir string
	// IP to listen on (default 127.0.0.1) and the two ports, which must be
	// free there.
	IP                   string
	ClientPort, PeerPort int
	// Wrap, when set, is the command line the etcd command is appended to
	// (for example ip netns exec NAME), and HTTP the client that reaches
	// it for the health check.
	Wrap []string
	HTTP *http.Client
}

// StartSpec is Start with the address and wrapping under the caller's
// control (for an etcd inside a test's network namespace).
func StartSpec(ctx context.Context, sp Spec) (*Server, error) { return start(ctx, sp) }

func start(ctx context.Context, sp Spec) (*Server, error) {
	ip := sp.IP
	if ip == "" {
		ip = "127.0.0.1"
	}
	hc := sp.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	dir := sp.Dir
	client := "http://" + net.JoinHostPort(ip, strconv.Itoa(sp.ClientPort))
	peer := "http://" + net.JoinHostPort(ip, strconv.Itoa(sp.PeerPort))
	args := append(append([]string{}, sp.Wrap...), sp.Binary,
		"--name", "kctl",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "kctl="+peer,
		"--log-level", "error", "--quota-backend-bytes", strconv.Itoa(4<<30),
		// Bulk port creation is one transaction of ~6 operations per port.
		"--max-txn-ops", "40000", "--max-request-bytes", strconv.Itoa(32<<20))
	cmd := exec.Command(args[0], args[1:]...)
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	_ = logf.Close() // the child has its own descriptor
	s := &Server{ClientURL: client, cmd: cmd}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := hc.Get(client + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s, nil
			}
		}
		select {
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.Stop()
	b, _ := os.ReadFile(filepath.Join(dir, "etcd.log"))
	return nil, fmt.Errorf("etcd did not become healthy: %s", b)
}

// Stop kills the etcd process (by its PID) and waits for it.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// StartT starts etcd for a test and stops it in cleanup.
func StartT(t testing.TB) *Server {
	t.Helper()
	bin := testutil.Bin(t, "tools/etcd")
	s, err := Start(context.Background(), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
