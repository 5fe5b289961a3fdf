package main

import (
	"context"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// cmdStatus reports ready only when the controller answers for our subnet;
// otherwise CNI error 50 (plugin not available) with the reason.
func cmdStatus(ctx context.Context, inv *invocation) error {
	c := inv.conf
	rctx, cancel := context.WithTimeout(ctx, c.reqTime)
	defer cancel()
	if _, err := inv.api.GetSubnet(rctx, c.Project, c.Subnet); err != nil {
		return types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("controller at %s not ready", c.base), err.Error())
	}
	return nil
}
