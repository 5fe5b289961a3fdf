package core

import (
	"fmt"
	"net/netip"
	"strings"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Limits of one load balancer.
const (
	maxListeners = 100
	maxMembers   = 5000
	// defaultAffinity is the source-IP persistence timeout when none is
	// given: kube-proxy's default for sessionAffinity ClientIP.
	defaultAffinity = 10800
	maxAffinity     = 86400
)

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
	if lb.VIPAddress != "" {
		a, err := netip.ParseAddr(lb.VIPAddress)
		if err != nil || a.Zone() != "" {
			return invalid("loadbalancer %s: vip_address %q is not an IP address", lb.ID, lb.VIPAddress)
		}
		lb.VIPAddress = a.Unmap().String()
	}
	if lb.Listeners, err = normalizeListeners(lb.Listeners); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if lb.Members, err = normalizeMembers(lb.Members); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	if err := normalizePersistence(lb.SessionPersistence); err != nil {
		return fmt.Errorf("loadbalancer %s: %w", lb.ID, err)
	}
	lb.VPCID, lb.VNI, lb.RevisionNumber = "", 0, 0
	lb.ProvisioningStatus, lb.OperatingStatus = "", ""
	return nil
}

func validPort(field string, p int, zeroOK bool) error {
	if p == 0 && zeroOK {
		return nil
	}
	if p < 1 || p > 65535 {
		return invalid("%s %d: want 1-65535", field, p)
	}
	return nil
}

// normalizeListeners checks listeners (protocol, ports, no duplicate
// protocol and port) and fills TargetPort.
func normalizeListeners(in []capi.Listener) ([]capi.Listener, error) {
	if len(in) > maxListeners {
		return nil, invalid("listeners: %d exceed %d", len(in), maxListeners)
	}
	seen := map[string]int{}
	out := make([]capi.Listener, 0, len(in))
	for i, l := range in {
		f := fmt.Sprintf("listeners[%d]", i)
		l.Protocol = strings.ToUpper(l.Protocol)
		switch l.Protocol {
		case capi.ProtocolTCP, capi.ProtocolUDP, capi.ProtocolSCTP:
		default:
			return nil, invalid("%s.protocol %q: want TCP, UDP or SCTP", f, l.Protocol)
		}
		if err := validPort(f+".port", l.Port, false); err != nil {
			return nil, err
		}
		if err := validPort(f+".target_port", l.TargetPort, true); err != nil {
			return nil, err
		}
		if l.TargetPort == 0 {
			l.TargetPort = l.Port
		}
		k := fmt.Sprintf("%s/%d", l.Protocol, l.Port)
		if j, dup := seen[k]; dup {
			return nil, invalid("%s: duplicate listener %s (as listeners[%d])", f, k, j)
		}
		seen[k] = i
		out = append(out, l)
	}
	return out, nil
}

// normalizeMembers checks members syntactically (address, port, port id,
// no duplicate address and port). Whether they lie in the VPC needs the
// store: see Core.checkMembers.
func normalizeMembers(in []capi.Member) ([]capi.Member, error) {
	if len(in) > maxMembers {
		return nil, invalid("members: %d exceed %d", len(in), maxMembers)
	}
	seen := make(map[capi.Member]int, len(in))
	out := make([]capi.Member, 0, len(in))
	for i, m := range in {
		f := fmt.Sprintf("members[%d]", i)
		a, err := netip.ParseAddr(m.Address)
		if err != nil || a.Zone() != "" {
			return nil, invalid("%s.address %q is not an IP address", f, m.Address)
		}
		m.Address = a.Unmap().String()
		if err := validPort(f+".port", m.Port, true); err != nil {
			return nil, err
		}
		if m.PortID != "" {
			if err := ValidID(f+".port_id", m.PortID); err != nil {
				return nil, err
			}
		}
		k := capi.Member{Address: m.Address, Port: m.Port}
		if j, dup := seen[k]; dup {
			return nil, invalid("%s: duplicate member %s port %d (as members[%d])", f, m.Address, m.Port, j)
		}
		seen[k] = i
		out = append(out, m)
	}
	return out, nil
}

func normalizePersistence(p *capi.SessionPersistence) error {
	if p == nil {
		return nil
	}
	if strings.ToUpper(p.Type) != capi.PersistenceSourceIP {
		return invalid("session_persistence.type %q: want %s", p.Type, capi.PersistenceSourceIP)
	}
	p.Type = capi.PersistenceSourceIP
	if p.Timeout == 0 {
		p.Timeout = defaultAffinity
	}
	if p.Timeout < 1 || p.Timeout > maxAffinity {
		return invalid("session_persistence.timeout %d: want 1-%d seconds", p.Timeout, maxAffinity)
	}
	return nil
}

// operating is the operating status of a load balancer with n members.
func operating(n int) string {
	if n > 0 {
		return capi.OperatingOnline
	}
	return capi.OperatingOffline
}
