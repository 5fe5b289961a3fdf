package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

type attachment struct{ containerID, ifName string }

// cmdGC deletes this host's ports on our subnet that were made by this
// plugin (name "k8s_<id>") and that no attachment in
// cni.dev/valid-attachments owns.
func cmdGC(ctx context.Context, inv *invocation) error {
	c := inv.conf
	valid := make(map[attachment]bool, len(c.ValidAttachments))
	for _, v := range c.ValidAttachments {
		valid[attachment{v.ContainerID, v.IfName}] = true
	}
	var ports []port
	err := inv.retry(ctx, "list ports", c.reqTime, func(rctx context.Context) (err error) {
		ports, err = inv.api.ListPorts(rctx, c.Project, portFilter{HostID: c.HostID, NetworkID: c.Subnet})
		return err
	})
	if err != nil {
		return fmt.Errorf("gc: list ports: %w", err)
	}
	var errs []error
	for _, p := range ports {
		if !ownedBy(c, p) || valid[attachment{p.DeviceID, p.VethName}] {
			continue
		}
		if err := deletePort(ctx, inv, p.ID); err != nil && !errors.Is(err, kerrors.NotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownedBy reports whether p was created by this plugin for network c: the
// id is the one ADD derives from the port's own device and interface.
func ownedBy(c *NetConf, p port) bool {
	return p.BindingHostID == c.HostID && p.NetworkID == c.Subnet &&
		strings.HasPrefix(p.Name, "k8s_") && p.ID == portID(c, p.DeviceID, p.VethName)
}
