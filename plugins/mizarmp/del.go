package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/utils"

	"kurma.dev/kurma/pkg/kerrors"
)

// cmdDel deletes the attachment's port. It needs neither the netns nor a
// cached result: the port id is derived from the attachment, and when no
// port has it (one created by another version, say), the ports bound to
// this host for the container id are listed and those with our interface
// name deleted. A missing port is success.
func cmdDel(ctx context.Context, inv *invocation) error {
	c, a := inv.conf, inv.args
	if err := utils.ValidateInterfaceName(a.IfName); err != nil {
		return err
	}
	id := portID(c, a.ContainerID, a.IfName)
	err := deletePort(ctx, inv, id)
	if err == nil || !errors.Is(err, kerrors.NotFound) {
		return err
	}
	ports, err := findPorts(ctx, inv, a.ContainerID, a.IfName)
	if errors.Is(err, kerrors.NotFound) {
		return nil // the project itself is gone: so is the port
	}
	if err != nil {
		return err
	}
	for _, p := range ports {
		if err := deletePort(ctx, inv, p.ID); err != nil && !errors.Is(err, kerrors.NotFound) {
			return err
		}
	}
	return nil
}

func deletePort(ctx context.Context, inv *invocation, id string) error {
	err := inv.retry(ctx, "delete port", inv.conf.reqTime, func(rctx context.Context) error {
		return inv.api.DeletePort(rctx, inv.conf.Project, id)
	})
	if err != nil {
		return fmt.Errorf("delete port %s: %w", id, err)
	}
	return nil
}

// findPorts lists this host's ports on our subnet for a container and
// interface.
func findPorts(ctx context.Context, inv *invocation, containerID, ifName string) ([]port, error) {
	c := inv.conf
	var ports []port
	err := inv.retry(ctx, "list ports", c.reqTime, func(rctx context.Context) (err error) {
		ports, err = inv.api.ListPorts(rctx, c.Project, portFilter{HostID: c.HostID, DeviceID: containerID})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list ports of %s: %w", containerID, err)
	}
	var out []port
	for _, p := range ports {
		if p.DeviceID == containerID && p.VethName == ifName && p.BindingHostID == c.HostID && p.NetworkID == c.Subnet {
			out = append(out, p)
		}
	}
	return out, nil
}
