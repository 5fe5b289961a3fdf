package core

import (
	"fmt"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// The limits, defaults and canonical forms of a load balancer are the
// contract of pkg/controllerapi (lbspec.go), shared with the agents and
// the Kubernetes Services reconciler; this file applies them to requests.

func invalid(format string, args ...any) error { return kerrors.New(kerrors.Invalid, format, args...) }

// NormalizeLoadBalancer checks the caller-settable fields of lb (in
// project pid) that need no stored state, fills defaults and clears the
// output-only fields. Errors name the field ("listeners[1].port").
func NormalizeLoadBalancer(pid string, lb *capi.LoadBalancer) error {
	var err error
	if lb.ID, err = idOrNew("loadbalancer", lb.ID); err != nil {
		return err
	}
	if lb.ProjectID != "" && lb.ProjectID != pid {
		return invalid("loadbalancer %s: project_id %q does not match the URL's project %q", lb.ID, lb.ProjectID, pid)
	}
	lb.ProjectID = pid
	if err := checkLen("name", lb.Name, 255); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if err := checkLen("description", lb.Description, 1024); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if lb.VIPSubnetID == "" {
		return invalid("loadbalancer %s: vip_subnet_id is required", lb.ID)
	}
	if err := ValidID("vip_subnet_id", lb.VIPSubnetID); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if lb.VIPAddress, err = capi.NormalizeVIP(lb.VIPAddress); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if lb.Listeners, err = capi.NormalizeListeners(lb.Listeners); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if lb.Members, err = capi.NormalizeMembers(lb.Members); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if err := capi.CheckMemberListeners(lb.Listeners, lb.Members); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if err := capi.NormalizePersistence(lb.SessionPersistence); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if err := capi.NormalizePolicy(&lb.Policy); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	lb.VPCID, lb.VNI, lb.RevisionNumber = "", 0, 0
	lb.ProvisioningStatus, lb.OperatingStatus = "", ""
	return nil
}

// operating is the operating status of a load balancer with n members.
func operating(n int) string {
	if n > 0 {
		return capi.OperatingOnline
	}
	return capi.OperatingOffline
}
