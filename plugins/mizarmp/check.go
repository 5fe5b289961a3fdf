package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/pkg/kerrors"
)

// cmdCheck verifies that the attachment's port is UP and that the
// interface in the netns carries the port's MAC and addresses (and, with a
// prevResult, that the result still matches the port).
func cmdCheck(ctx context.Context, inv *invocation) error {
	c, a := inv.conf, inv.args
	if err := utils.ValidateInterfaceName(a.IfName); err != nil {
		return err
	}
	p, err := lookupPort(ctx, inv)
	if err != nil {
		return err
	}
	if p.Status != statusUp {
		return types.NewError(types.ErrInternal, fmt.Sprintf("port %s is %s, want UP", p.ID, p.Status), p.StatusReason)
	}
	var want []net.IP
	for _, f := range p.FixedIPs {
		if ip := net.ParseIP(f.IPAddress); ip != nil {
			want = append(want, ip)
		}
	}
	if c.PrevResult != nil {
		prev, err := types100.NewResultFromResult(c.PrevResult)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, "convert prevResult", err.Error())
		}
		for _, ip := range want {
			if !resultHasIP(prev, ip) {
				return types.NewError(types.ErrInternal,
					fmt.Sprintf("prevResult lacks port %s address %s", p.ID, ip), "")
			}
		}
	}
	if a.Netns == "" {
		return nil
	}
	return ns.WithNetNSPath(a.Netns, func(ns.NetNS) error {
		return checkLink(a.IfName, p.MACAddress, want)
	})
}

// lookupPort finds the attachment's port by its derived id, then by list.
func lookupPort(ctx context.Context, inv *invocation) (*port, error) {
	c, a := inv.conf, inv.args
	var p *port
	err := inv.retry(ctx, "get port", c.reqTime, func(rctx context.Context) (err error) {
		p, err = inv.api.GetPort(rctx, c.Project, portID(c, a.ContainerID, a.IfName))
		return err
	})
	if err == nil {
		return p, nil
	}
	if !errors.Is(err, kerrors.NotFound) {
		return nil, fmt.Errorf("get port: %w", err)
	}
	ports, err := findPorts(ctx, inv, a.ContainerID, a.IfName)
	if err != nil {
		return nil, err
	}
	if len(ports) == 0 {
		return nil, types.NewError(types.ErrUnknownContainer,
			fmt.Sprintf("no port for container %s interface %s", a.ContainerID, a.IfName), "")
	}
	return &ports[0], nil
}

func resultHasIP(r *types100.Result, ip net.IP) bool {
	for _, c := range r.IPs {
		if c.Address.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// checkLink runs inside the container netns.
func checkLink(ifName, mac string, want []net.IP) error {
	link, err := net.InterfaceByName(ifName)
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("interface %s: %v", ifName, err), "")
	}
	if !strings.EqualFold(link.HardwareAddr.String(), mac) {
		return types.NewError(types.ErrInternal,
			fmt.Sprintf("interface %s has MAC %s, port has %s", ifName, link.HardwareAddr, mac), "")
	}
	addrs, err := link.Addrs()
	if err != nil {
		return types.NewError(types.ErrInternal, fmt.Sprintf("addresses of %s: %v", ifName, err), "")
	}
	for _, ip := range want {
		found := false
		for _, ad := range addrs {
			if n, ok := ad.(*net.IPNet); ok && n.IP.Equal(ip) {
				found = true
				break
			}
		}
		if !found {
			return types.NewError(types.ErrInternal,
				fmt.Sprintf("interface %s lacks address %s", ifName, ip), "")
		}
	}
	return nil
}
