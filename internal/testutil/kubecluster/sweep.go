package kubecluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"kurma.dev/kurma/internal/testutil"
)

// dirPrefix names the clusters' folders in os.TempDir().
const dirPrefix = "kkc"

// record is what a cluster writes to <Dir>/cluster.json as it makes host
// state, so that a later Start can undo a cluster whose test binary died
// before Close (its daemons die with it, through their parent-death
// signal; its mounts, cgroups, namespace, shims and kernel settings stay).
type record struct {
	NetNS            string            `json:"netns,omitempty"`
	CgroupRoot       string            `json:"cgroupRoot,omitempty"`
	ContainerdSocket string            `json:"containerdSocket,omitempty"`
	Sysctls          map[string]string `json:"sysctls,omitempty"`
	// NewDirs are the hostDirs that did not exist when the node started.
	NewDirs []string `json:"newDirs,omitempty"`
	// Nodes are the nodes after the first (whose fields are above).
	Nodes []nodeRecord `json:"nodes,omitempty"`
	// Switch is the underlay switch's namespace.
	Switch string `json:"switch,omitempty"`
}

// nodeRecord is what a node after the first leaves on the host.
type nodeRecord struct {
	NetNS            string `json:"netns,omitempty"`
	CgroupRoot       string `json:"cgroupRoot,omitempty"`
	ContainerdSocket string `json:"containerdSocket,omitempty"`
	Dir              string `json:"dir,omitempty"`
	// Binds are the node's private folders (Node.binds).
	Binds map[string]string `json:"binds,omitempty"`
}

// saveRecord writes the cluster's record.
func (c *Cluster) saveRecord() error {
	r := record{NetNS: c.NetNS, Sysctls: c.sysctls, NewDirs: c.newDirs, Switch: c.SwitchNetNS}
	for i, n := range c.Nodes {
		if i == 0 {
			r.CgroupRoot, r.ContainerdSocket = n.CgroupRoot, n.ContainerdSocket
			continue
		}
		r.Nodes = append(r.Nodes, nodeRecord{NetNS: n.NetNS, CgroupRoot: n.CgroupRoot,
			ContainerdSocket: n.ContainerdSocket, Dir: n.Dir, Binds: n.binds})
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "cluster.json"), b, 0o600)
}

// sweep undoes clusters left by dead test binaries. It runs under the host
// lock, so no folder it finds belongs to a live cluster.
func sweep() error {
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		var r record
		if b, err := os.ReadFile(filepath.Join(d, "cluster.json")); err == nil {
			if err := json.Unmarshal(b, &r); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", d, err))
				continue
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		c := &Cluster{Dir: d, NetNS: r.NetNS}
		nodes := append([]nodeRecord{{NetNS: r.NetNS, CgroupRoot: r.CgroupRoot, ContainerdSocket: r.ContainerdSocket,
			Dir: d}}, r.Nodes...)
		for _, nr := range nodes {
			n := &Node{c: c, NetNS: nr.NetNS, ContainerdSocket: nr.ContainerdSocket, Dir: nr.Dir, binds: nr.Binds}
			if fi, err := os.Stat(filepath.Join(nr.Dir, "cni", "net.d")); err == nil && fi.IsDir() {
				n.CNIConfDir = filepath.Join(nr.Dir, "cni", "net.d")
			}
			if nr.ContainerdSocket != "" {
				errs = append(errs, n.sweepSandboxes(), n.killShims())
			}
			if strings.HasPrefix(nr.CgroupRoot, "/"+dirPrefix) {
				errs = append(errs, removeCgroups(nr.CgroupRoot))
				if err := os.Remove(devicePluginSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		for _, nr := range r.Nodes {
			if nr.NetNS != "" {
				errs = append(errs, testutil.RemoveNetNS(nr.NetNS))
			}
		}
		if r.Switch != "" {
			errs = append(errs, testutil.RemoveNetNS(r.Switch))
		}
		errs = append(errs, unmountUnder(d), removeContainerLogLinks(d), restoreSysctls(r.Sysctls))
		if r.NetNS != "" {
			errs = append(errs, testutil.RemoveNetNS(r.NetNS))
		}
		errs = append(errs, os.RemoveAll(d))
		removeEmptyDirs(r.NewDirs)
	}
	return errors.Join(errs...)
}

// sweepSandboxes restarts a dead cluster node's containerd with its own
// config, in its own namespace, and removes its pod sandboxes through the
// CRI, so that their CNI DEL runs and their namespaces and mounts go.
func (n *Node) sweepSandboxes() error {
	cfg := filepath.Join(filepath.Dir(n.ContainerdSocket), "config.toml")
	if _, err := os.Stat(cfg); err != nil {
		return nil // containerd never started
	}
	if _, err := os.Stat(n.NetNS); err != nil {
		return nil
	}
	var err error
	if n.spawn, err = newSpawner(n.NetNS); err != nil {
		return err
	}
	defer n.spawn.stop()
	if len(n.binds) > 0 { // a node after the first: its own folders again
		if err := n.spawn.do(n.privateMounts); err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
	}
	p, err := n.StartProcess("containerd-sweep", exec.Command("containerd", "--config", cfg))
	if err != nil {
		return err
	}
	defer p.Stop(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err := n.ctr(ctx, "version"); err == nil {
			break
		}
		select {
		case <-p.Done():
			return fmt.Errorf("sweep: containerd exited: %v", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("sweep: containerd not ready: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return n.removeSandboxes()
}
