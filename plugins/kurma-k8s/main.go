// Command kurma-k8s is the Kubernetes CNI driver of Kurma: a thin shim
// that forwards each CNI invocation (its CNI_* environment and the network
// config on stdin) over a unix socket to the node agent's CNI daemon
// (internal/kube/cnid), and prints the daemon's answer with its exit
// code. The agent does the work (reads the pod's kurma.dev/pod-networks
// annotation from its watch cache, plugs the port, waits until UP), so no
// Kubernetes client, netlink work or API round trip starts in each exec.
//
// VERSION is answered here, so that a runtime can probe the plugin while
// the agent is down. An agent that cannot be reached is CNI error 11 (try
// again later), except for DEL: the shim leaves the request in the
// agent's DEL queue (cniwire.DelQueue) and succeeds, so that a pod deleted
// while its node's agent is down (an upgrade, a crash) does not keep its
// sandbox and network namespace until the agent returns; the agent carries
// the DEL out when it starts.
//
// Network config: {"cniVersion":"1.1.0","name":"kurma","type":"kurma-k8s",
// "socket":"/run/kurma/cni.sock"} ("socket" optional).
//
// This package must stay small. Must not depend on: `k8s.io/...`,
// `github.com/vishvananda/...`, `github.com/containernetworking/...`,
// `net/http`.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"kurma.dev/kurma/internal/kube/cniwire"
)

// versions are the CNI versions the driver speaks.
var versions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// timeout bounds a whole invocation, well below the kubelet's 4-minute
// sandbox limit (the agent's own limits are shorter).
const timeout = 90 * time.Second

func main() {
	os.Exit(run(os.Stdout))
}

func run(out io.Writer) int {
	stdin, err := io.ReadAll(io.LimitReader(os.Stdin, cniwire.MaxMessage))
	if err != nil {
		return fail(out, "", 5, "read stdin", err.Error())
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Socket     string `json:"socket"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil && os.Getenv("CNI_COMMAND") != "VERSION" {
		return fail(out, "", 6, "decode network config", err.Error())
	}
	if os.Getenv("CNI_COMMAND") == "VERSION" {
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "supportedVersions": versions})
		_, _ = out.Write(append(b, '\n'))
		return 0
	}
	sock := conf.Socket
	if sock == "" {
		sock = cniwire.DefaultSocket
	}
	req := cniwire.Request{Env: map[string]string{}, Stdin: stdin}
	for _, k := range cniwire.EnvKeys {
		if v, ok := os.LookupEnv(k); ok {
			req.Env[k] = v
		}
	}
	resp, err := call(sock, &req)
	if err != nil {
		if req.Env["CNI_COMMAND"] == "DEL" {
			qerr := queueDel(sock, &req)
			if qerr == nil {
				return 0
			}
			err = errors.Join(err, qerr)
		}
		return fail(out, conf.CNIVersion, 11, "kurma agent not reachable", err.Error())
	}
	_, _ = out.Write(resp.Stdout)
	return resp.ExitCode
}

// queueDel leaves req in the agent's DEL queue: written to a temporary
// file, then renamed, so the agent never reads half a request.
func queueDel(sock string, req *cniwire.Request) error {
	name := cniwire.QueueFile(req.Env["CNI_CONTAINERID"], req.Env["CNI_IFNAME"])
	if name == "" {
		return errors.New("DEL not queued: CNI_CONTAINERID or CNI_IFNAME is not a file name")
	}
	dir := cniwire.DelQueue(sock)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("queue DEL: %w", err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("queue DEL: %w", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("queue DEL: %w", err)
	}
	return nil
}

// call sends one request and reads the answer.
func call(sock string, req *cniwire.Request) (*cniwire.Response, error) {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return nil, fmt.Errorf("send to %s: %w", sock, err)
	}
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	var resp cniwire.Response
	if err := json.NewDecoder(io.LimitReader(c, cniwire.MaxMessage)).Decode(&resp); err != nil {
		return nil, fmt.Errorf("answer from %s: %w", sock, err)
	}
	return &resp, nil
}

// fail prints CNI error JSON and returns the exit status 1.
func fail(out io.Writer, cniVersion string, code int, msg, details string) int {
	if cniVersion == "" {
		cniVersion = "1.1.0"
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "code": code, "msg": msg, "details": details})
	_, _ = out.Write(append(b, '\n'))
	return 1
}
