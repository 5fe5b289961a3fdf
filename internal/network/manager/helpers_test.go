package manager_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/uuid"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/testutil"
)

// env is one test's plugins: the real kurma-netplugin binary behind
// add/del links in one folder per network, with its own CNI state dir.
type env struct {
	t      *testing.T
	caller *manager.HostCaller
	state  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	bin := testutil.Bin(t, "kurma-netplugin")
	cni := filepath.Join(filepath.Dir(bin), "cni")
	if _, err := os.Stat(filepath.Join(cni, "bridge")); err != nil {
		t.Skipf("CNI plugins not built in %s (make build)", cni)
	}
	state := t.TempDir()
	e := &env{t: t, state: state, caller: &manager.HostCaller{Dirs: map[string]string{},
		Env: []string{"KURMA_CNI_PATH=" + cni, "KURMA_NETWORK_STATE_DIR=" + state}}}
	return e
}

// realDir makes a plugin folder whose add and del are the real plugin.
func (e *env) realDir() string {
	bin := testutil.Bin(e.t, "kurma-netplugin")
	d := e.t.TempDir()
	for _, v := range []string{"add", "del"} {
		if err := os.Symlink(bin, filepath.Join(d, v)); err != nil {
			e.t.Fatal(err)
		}
	}
	return d
}

// scriptDir makes a plugin folder with shell scripts for add and del.
func (e *env) scriptDir(add, del string) string {
	d := e.t.TempDir()
	for v, body := range map[string]string{"add": add, "del": del} {
		if err := os.WriteFile(filepath.Join(d, v), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	return d
}

// bridgeNet configures a bridge network on a fresh knm bridge and a /24
// outside 10.220.0.0/16; the bridge is deleted when the test ends.
func (e *env) bridgeNet(name, iface string, def bool) netconf.Network {
	e.t.Helper()
	br := testutil.UniqueName("knm")
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	subnet := fmt.Sprintf("10.177.%d.0/24", b[0])
	entry := map[string]any{
		"name": name, "aci": "file:///nonexistent/kurma-netplugin.aci", "default": def,
		"containerInterface": iface, "cniVersion": "1.0.0", "type": "bridge", "bridge": br,
		"isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "subnet": subnet,
			"dataDir": filepath.Join(e.state, "ipam"), "routes": []map[string]string{{"dst": "0.0.0.0/0"}}},
	}
	raw, _ := json.Marshal(entry)
	n, err := netconf.ParseEntry(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	e.caller.Dirs[name] = e.realDir()
	e.t.Cleanup(func() {
		if l, err := netlink.LinkByName(br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return n
}

func (e *env) manager(nets []netconf.Network, timeout time.Duration) *manager.Manager {
	e.t.Helper()
	m, err := manager.New(manager.Options{Networks: nets, Caller: e.caller, CallTimeout: timeout})
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// newPod returns a pod record on a fresh netns.
func newPod(t *testing.T, networks ...string) (*pod.Pod, ns.NetNS) {
	n := testutil.NewNetNS(t)
	return &pod.Pod{UUID: uuid.NewString(), NetNS: n.Path(), Spec: pod.Spec{Networks: networks}}, n
}

// bridgePorts counts the links enslaved to the bridge named br.
func bridgePorts(t *testing.T, br string) int {
	t.Helper()
	l, err := netlink.LinkByName(br)
	if err != nil {
		return 0
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	for _, x := range links {
		if x.Attrs().MasterIndex == l.Attrs().Index {
			c++
		}
	}
	return c
}

// reservations lists host-local's reservation files for network name.
func (e *env) reservations(name string) []string {
	ents, _ := os.ReadDir(filepath.Join(e.state, "ipam", name))
	var out []string
	for _, x := range ents {
		if n := x.Name(); n != "lock" && len(n) > 0 && n[0] != 'l' {
			out = append(out, n)
		}
	}
	return out
}

// listen starts a TCP echo-less listener in netns n on port; it accepts and
// closes connections until the test ends.
func listen(t *testing.T, n ns.NetNS, addr string) {
	t.Helper()
	var l net.Listener
	err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
}

// dial connects from netns n to addr and reads the greeting.
func dial(ctx context.Context, n ns.NetNS, addr string) error {
	return n.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 2)
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Read(b); err != nil || string(b) != "ok" {
			return fmt.Errorf("read from %s: %q %v", addr, b, err)
		}
		return nil
	})
}

// podIP returns the first IP of the pod's first attachment.
func podIP(t *testing.T, raw []json.RawMessage) (net.IP, net.IP) {
	t.Helper()
	atts, err := manager.DecodeAttachments(raw)
	if err != nil || len(atts) == 0 || atts[0].Result == nil || len(atts[0].Result.IPs) == 0 {
		t.Fatalf("attachments %s: %v", raw, err)
	}
	ip := atts[0].Result.IPs[0]
	return ip.Address.IP, ip.Gateway
}
