package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"

	"kurma.dev/kurma/pkg/kerrors"
)

// portNamespace seeds the name-based port ids (UUID v5, RFC 9562): the
// bytes of 6f1d3c2e-8a55-4f0b-9c7e-2b8e1d4a9f10.
var portNamespace = [16]byte{0x6f, 0x1d, 0x3c, 0x2e, 0x8a, 0x55, 0x4f, 0x0b, 0x9c, 0x7e, 0x2b, 0x8e, 0x1d, 0x4a, 0x9f, 0x10}

// uuidV5 is the name-based (SHA-1) UUID of name in namespace ns, in its
// 8-4-4-4-12 text form. (Written out here rather than taken from a UUID
// module, which would add crypto/rand and more to the plugin's start.)
func uuidV5(ns [16]byte, name []byte) string {
	h := sha1.New()
	h.Write(ns[:])
	h.Write(name)
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// portID is the id of the port for one attachment. It is derived from the
// host, network name, container id and interface, which CNI guarantees are
// unique among live attachments, so DEL and CHECK find the port with one
// request and no cached state.
func portID(c *NetConf, containerID, ifName string) string {
	key := strings.Join([]string{c.HostID, c.Project, c.Subnet, c.Name, containerID, ifName}, "\x00")
	return uuidV5(portNamespace, []byte(key))
}

func ptr[T any](v T) *T { return &v }

// newPort builds the create-port body exactly as spec 003 shows it.
func newPort(inv *invocation) port {
	c, a := inv.conf, inv.args
	id := portID(c, a.ContainerID, a.IfName)
	sandbox := inv.cni.SandboxID
	if sandbox == "" {
		sandbox = a.ContainerID
	}
	host, _ := os.Hostname()
	return port{
		ProjectID:           c.Project,
		ID:                  id,
		Name:                "k8s_" + id,
		AdminStateUp:        ptr(true),
		Description:         fmt.Sprintf("cni %s, ns:%s, host:%s", sandbox, a.Netns, host),
		NetworkID:           c.Subnet,
		DeviceID:            a.ContainerID,
		VethName:            a.IfName,
		NetworkNS:           a.Netns,
		PortSecurityEnabled: ptr(false),
		BindingHostID:       c.HostID,
		BindingVNICType:     "normal",
		FastPath:            ptr(true),
	}
}

// cmdAdd creates the port, waits until the agent reports it UP, and prints
// the result in the config's cniVersion. On any failure after the create
// the port is deleted again.
func cmdAdd(ctx context.Context, inv *invocation) (retErr error) {
	c, a := inv.conf, inv.args
	if err := utils.ValidateInterfaceName(a.IfName); err != nil {
		return err
	}
	if c.PrevResult != nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			(&fieldError{"prevResult", "mizarmp must be the first plugin of its chain"}).Error(), "")
	}
	want := newPort(inv)

	// The subnet does not change while we wait: fetch it concurrently
	// with the create (it only supplies the DNS servers and checks the
	// address; the port's fixed_ips carry cidr and gateway).
	type subnetResult struct {
		s   *subnet
		err error
	}
	subCh := make(chan subnetResult, 1)
	go func() {
		var s *subnet
		err := inv.retry(ctx, "get subnet", c.reqTime, func(rctx context.Context) (err error) {
			s, err = inv.api.GetSubnet(rctx, c.Project, c.Subnet)
			return err
		})
		subCh <- subnetResult{s, err}
	}()

	// One request creates the port and waits for UP; the up timeout
	// counts from here.
	deadline := time.Now().Add(c.upTimeout)
	created, err := createPort(ctx, inv, want)
	if err != nil {
		if mayExist(err) {
			rollback(inv, want.ID)
		}
		return err
	}
	defer func() {
		if retErr != nil {
			rollback(inv, created.ID)
		}
	}()
	up, err := waitUp(ctx, inv, created, deadline)
	if err != nil {
		return err
	}
	sr := <-subCh
	if sr.err != nil {
		return fmt.Errorf("get subnet %s: %w", c.Subnet, sr.err)
	}
	res, err := buildResult(c, a.IfName, a.Netns, up, sr.s)
	if err != nil {
		return err
	}
	return types.PrintResult(res, c.CNIVersion)
}

// mayExist reports whether a failed create may still have created the
// port: the request was sent but its answer was lost (timeout, controller
// gone mid-wait). A rejection by the controller created nothing.
func mayExist(err error) bool {
	for _, k := range []error{kerrors.Conflict, kerrors.Invalid, kerrors.NotFound, kerrors.Unauthorized, kerrors.Exhausted} {
		if errors.Is(err, k) {
			return false
		}
	}
	return true
}

// createPort POSTs the port with the long poll's query, so that the answer
// normally comes once the agent has reported it UP (a controller that does
// not wait on create answers PENDING; waitUp then long-polls).
//
// A transient failure (controller restarting, connection lost) is retried
// within the retry budget. Creation is idempotent because the port id is
// derived from the attachment: when a retried POST finds a port with our id
// that matches this attachment, it is the one our lost POST made, and it is
// adopted. A conflict on the first POST means a port with our id survived
// an earlier ADD that never got its DEL (a crash): it is replaced once.
func createPort(ctx context.Context, inv *invocation, p port) (*port, error) {
	c := inv.conf
	backoff := retryFirstBackoff
	retried, replaced := false, false
	for {
		rctx, cancel := context.WithTimeout(ctx, c.upTimeout+c.reqTime)
		created, err := inv.api.CreatePortWait(rctx, c.Project, p, statusUp, c.upTimeout)
		cancel()
		switch {
		case err == nil:
			return created, nil
		case transient(err):
			if !inv.wait(ctx, backoff) {
				return nil, fmt.Errorf("create port %s: %w", p.ID, err)
			}
			slog.Debug("retrying create after a transient controller error", "port", p.ID, "err", err)
			backoff = min(2*backoff, retryMaxBackoff)
			retried = true
			continue
		case !errors.Is(err, kerrors.Conflict):
			return nil, fmt.Errorf("create port %s: %w", p.ID, err)
		}
		var old *port
		gerr := inv.retry(ctx, "get port", c.reqTime, func(rctx context.Context) (err error) {
			old, err = inv.api.GetPort(rctx, c.Project, p.ID)
			return err
		})
		if gerr != nil || old.DeviceID != p.DeviceID || old.BindingHostID != p.BindingHostID {
			return nil, fmt.Errorf("create port %s: %w", p.ID, err)
		}
		if retried && old.NetworkID == p.NetworkID && old.VethName == p.VethName && old.NetworkNS == p.NetworkNS {
			return old, nil // made by a POST of ours whose answer was lost
		}
		if replaced {
			return nil, fmt.Errorf("create port %s: %w", p.ID, err)
		}
		slog.Warn("replacing stale port", "port", p.ID, "container", p.DeviceID)
		derr := inv.retry(ctx, "delete stale port", c.reqTime, func(rctx context.Context) error {
			return inv.api.DeletePort(rctx, c.Project, p.ID)
		})
		if derr != nil && !errors.Is(derr, kerrors.NotFound) {
			return nil, fmt.Errorf("delete stale port %s: %w", p.ID, derr)
		}
		replaced = true
	}
}

// rollback deletes a port created by a failed ADD, on a fresh context so a
// cancelled ADD still cleans up (retrying transient errors while the ADD's
// retry budget lasts).
func rollback(inv *invocation, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), max(inv.conf.reqTime, time.Until(inv.retryUntil)))
	defer cancel()
	err := inv.retry(ctx, "rollback", inv.conf.reqTime, func(rctx context.Context) error {
		return inv.api.DeletePort(rctx, inv.conf.Project, id)
	})
	if err != nil && !errors.Is(err, kerrors.NotFound) {
		slog.Error("rollback: delete port", "port", id, "err", err)
	}
}

// waitUp blocks until the port is UP, using the controller's long poll and
// falling back to plain polling (with backoff) when a poll returns early
// without UP. It gives up at deadline (the config's up timeout after the
// create was sent; spec 003: 1m).
func waitUp(ctx context.Context, inv *invocation, p *port, deadline time.Time) (*port, error) {
	c := inv.conf
	backoff := 5 * time.Millisecond
	for {
		switch p.Status {
		case statusUp:
			return p, nil
		case statusError:
			return nil, fmt.Errorf("port %s is ERROR: %s", p.ID, p.StatusReason)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("port %s still %s after %s: %w", p.ID, p.Status, c.upTimeout,
				kerrors.New(kerrors.Timeout, "waiting for UP"))
		}
		start := time.Now()
		var np *port
		err := inv.retry(ctx, "wait for port", left+c.reqTime, func(rctx context.Context) (err error) {
			np, err = inv.api.WaitPort(rctx, c.Project, p.ID, statusUp, max(time.Until(deadline), time.Millisecond))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("wait for port %s: %w", p.ID, err)
		}
		p = np
		if p.Status == statusUp || p.Status == statusError {
			continue
		}
		// Returned early without UP: the controller ignores long polls, or
		// the port is DOWN. Poll with backoff.
		if time.Since(start) < left/2 {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("wait for port %s: %w", p.ID, ctx.Err())
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 500*time.Millisecond)
		}
	}
}

// buildResult turns the UP port and its subnet into a CNI 1.x result.
func buildResult(c *NetConf, ifName, netns string, p *port, s *subnet) (*types100.Result, error) {
	if len(p.FixedIPs) == 0 {
		return nil, fmt.Errorf("port %s has no fixed_ips", p.ID)
	}
	_, cidr, err := net.ParseCIDR(s.CIDR)
	if err != nil {
		return nil, fmt.Errorf("subnet %s cidr %q: %w", s.ID, s.CIDR, err)
	}
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{{Name: ifName, Mac: p.MACAddress, Sandbox: netns}},
		DNS:        c.DNS,
	}
	if len(res.DNS.Nameservers) == 0 {
		res.DNS.Nameservers = s.DNSNameservers
	}
	gw := net.ParseIP(s.GatewayIP)
	for _, f := range p.FixedIPs {
		ip := net.ParseIP(f.IPAddress)
		if ip == nil || !cidr.Contains(ip) {
			return nil, fmt.Errorf("port %s address %q is not in subnet %s", p.ID, f.IPAddress, s.CIDR)
		}
		if ip4 := ip.To4(); ip4 != nil {
			ip = ip4
		}
		res.IPs = append(res.IPs, &types100.IPConfig{
			Interface: types100.Int(0),
			Address:   net.IPNet{IP: ip, Mask: cidr.Mask},
			Gateway:   gw,
		})
	}
	if gw != nil {
		dst := net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if gw.To4() == nil {
			dst = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		res.Routes = []*types.Route{{Dst: dst, GW: gw}}
	}
	return res, nil
}
