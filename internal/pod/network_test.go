package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"kurma.dev/kurma/internal/testutil"
)

// dummyNet is a Networker that puts a real veth pair into the pod's network
// namespace.
type dummyNet struct {
	name     string
	mu       sync.Mutex
	attached map[string]bool
	detached int
}

func (d *dummyNet) Attach(ctx context.Context, p *Pod) ([]json.RawMessage, error) {
	if p.NetNS == "" {
		return nil, errors.New("no netns")
	}
	err := ns.WithNetNSPath(p.NetNS, func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: d.name}, PeerName: d.name + "p"})
	})
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.attached[p.UUID] = true
	d.mu.Unlock()
	return []json.RawMessage{json.RawMessage(fmt.Sprintf(`{"interface":%q}`, d.name))}, nil
}

func (d *dummyNet) Detach(ctx context.Context, p *Pod) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.detached++
	delete(d.attached, p.UUID)
	if p.NetNS == "" {
		return nil
	}
	err := ns.WithNetNSPath(p.NetNS, func(ns.NetNS) error {
		l, err := netlink.LinkByName(d.name)
		if err != nil {
			return nil // gone already
		}
		return netlink.LinkDel(l)
	})
	var nsErr ns.NSPathNotExistErr
	if errors.As(err, &nsErr) {
		return nil
	}
	return err
}

func TestNetworkerHook(t *testing.T) {
	net := &dummyNet{name: testutil.UniqueName("kpod"), attached: map[string]bool{}}
	f := newFixture(t, "normal", func(o *Options) { o.Network = net })
	ctx := t.Context()
	p, err := f.rt.Create(ctx, f.spec("kpod-net"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Networks) != 1 || !strings.Contains(string(p.Networks[0]), net.name) {
		t.Errorf("pod networks %s", p.Networks)
	}
	// The stager found the interface when it started.
	ifs := readState(t, f, p.UUID)["interfaces"].([]any)
	found := false
	for _, i := range ifs {
		found = found || i == net.name
	}
	if !found {
		t.Errorf("stager saw interfaces %v, not %s", ifs, net.name)
	}
	if err := f.rt.Stop(ctx, p.UUID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	net.mu.Lock()
	defer net.mu.Unlock()
	if len(net.attached) != 0 || net.detached == 0 {
		t.Errorf("after stop: attached %v, %d detaches", net.attached, net.detached)
	}
}
