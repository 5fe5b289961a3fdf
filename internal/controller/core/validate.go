package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/uuid"

	"kurma.dev/kurma/internal/controller/ipam"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// ValidID accepts ids safe as store key segments (capi.ValidID).
func ValidID(kind, id string) error { return capi.ValidID(kind, id) }

// idOrNew validates a client-chosen id or generates one. Generated ids
// are time-ordered UUIDs (v7) so new keys append to the store's B+tree
// instead of dirtying random pages.
func idOrNew(kind, id string) (string, error) {
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return uuid.NewString(), nil
		}
		return u.String(), nil
	}
	return id, ValidID(kind, id)
}

func checkLen(field, v string, max int) error {
	if len(v) > max {
		return kerrors.New(kerrors.Invalid, "%s longer than %d bytes", field, max)
	}
	return nil
}

var vnicTypes = map[string]bool{"": true, "normal": true, "macvtap": true, "direct": true, "baremetal": true, "smart-nic": true, "direct-physical": true, "virtio-forwarder": true}

// NormalizePort validates the caller-settable fields of p (in project pid)
// and fills defaults; it does not resolve references.
func NormalizePort(pid string, p *capi.Port) error {
	var err error
	if p.ID, err = idOrNew("port", p.ID); err != nil {
		return err
	}
	if p.ProjectID != "" && p.ProjectID != pid {
		return kerrors.New(kerrors.Invalid, "port %s: project_id %q does not match the URL's project %q", p.ID, p.ProjectID, pid)
	}
	if p.TenantID != "" && p.TenantID != pid {
		return kerrors.New(kerrors.Invalid, "port %s: tenant_id %q does not match the URL's project %q", p.ID, p.TenantID, pid)
	}
	p.ProjectID = pid
	if p.NetworkID == "" {
		return kerrors.New(kerrors.Invalid, "port %s: network_id is required", p.ID)
	}
	if err := ValidID("network", p.NetworkID); err != nil {
		return fmt.Errorf("port %s: %w", p.ID, err)
	}
	for _, c := range []struct {
		f, v string
		max  int
	}{{"name", p.Name, 255}, {"description", p.Description, 1024}, {"device_id", p.DeviceID, 255}, {"device_owner", p.DeviceOwner, 255},
		{"network_ns", p.NetworkNS, 4096}, {"veth_namespace", p.VethNamespace, 4096}, {"dns_domain", p.DNSDomain, 255}, {"dns_name", p.DNSName, 255}, {"binding:host_id", p.BindingHostID, 255}} {
		if err := checkLen(c.f, c.v, c.max); err != nil {
			return fmt.Errorf("port %s: %w", p.ID, err)
		}
	}
	if strings.ContainsAny(p.Name, "/\x00") || strings.ContainsAny(p.DeviceID, "/\x00") || strings.ContainsAny(p.BindingHostID, "/\x00") {
		return kerrors.New(kerrors.Invalid, "port %s: name, device_id and binding:host_id must not contain '/' or NUL", p.ID)
	}
	if p.VethName != "" {
		if len(p.VethName) > 15 || strings.ContainsAny(p.VethName, "/ \t\n\x00:") || p.VethName == "." || p.VethName == ".." {
			return kerrors.New(kerrors.Invalid, "port %s: veth_name %q is not a valid interface name", p.ID, p.VethName)
		}
	}
	if p.NetworkNS != "" && p.VethNamespace != "" && p.NetworkNS != p.VethNamespace {
		return kerrors.New(kerrors.Invalid, "port %s: network_ns and veth_namespace differ", p.ID)
	}
	if p.NetworkNS == "" {
		p.NetworkNS = p.VethNamespace
	}
	p.VethNamespace = p.NetworkNS
	if !vnicTypes[p.BindingVNICType] {
		return kerrors.New(kerrors.Invalid, "port %s: binding:vnic_type %q unknown", p.ID, p.BindingVNICType)
	}
	if p.BindingVNICType == "" {
		p.BindingVNICType = "normal"
	}
	if len(p.BindingProfile) > 0 {
		t := bytes.TrimSpace(p.BindingProfile)
		if bytes.Equal(t, []byte("null")) {
			p.BindingProfile = nil
		} else if len(t) == 0 || t[0] != '{' {
			return kerrors.New(kerrors.Invalid, "port %s: binding:profile must be an object or null", p.ID)
		} else {
			var c bytes.Buffer
			if err := json.Compact(&c, t); err != nil {
				return kerrors.New(kerrors.Invalid, "port %s: binding:profile: %v", p.ID, err)
			}
			p.BindingProfile = c.Bytes()
		}
	}
	if p.AdminStateUp == nil {
		t := true
		p.AdminStateUp = &t
	}
	var pairs []capi.AddressPair
	for _, ap := range p.AllowedAddressPairs {
		if ap.IPAddress == "" && ap.MACAddress == "" {
			continue // spec 003 sends [{}]
		}
		if _, err := netip.ParseAddr(ap.IPAddress); err != nil {
			if _, err := netip.ParsePrefix(ap.IPAddress); err != nil {
				return kerrors.New(kerrors.Invalid, "port %s: allowed_address_pairs ip_address %q", p.ID, ap.IPAddress)
			}
		}
		if ap.MACAddress != "" {
			m, err := ipam.ParseMAC(ap.MACAddress)
			if err != nil {
				return fmt.Errorf("port %s: allowed_address_pairs: %w", p.ID, err)
			}
			ap.MACAddress = m
		}
		pairs = append(pairs, ap)
	}
	p.AllowedAddressPairs = pairs
	if p.MACAddress != "" {
		m, err := ipam.ParseMAC(p.MACAddress)
		if err != nil {
			return fmt.Errorf("port %s: %w", p.ID, err)
		}
		p.MACAddress = m
	}
	if len(p.FixedIPs) > 1 {
		return kerrors.New(kerrors.Invalid, "port %s: at most one fixed_ips entry is supported", p.ID)
	}
	for i := range p.FixedIPs {
		f := &p.FixedIPs[i]
		f.CIDR, f.GatewayIP = "", ""
		if f.SubnetID != "" {
			if err := ValidID("subnet", f.SubnetID); err != nil {
				return fmt.Errorf("port %s: fixed_ips: %w", p.ID, err)
			}
		}
	}
	// Output-only fields are ignored on input.
	p.Status, p.StatusReason, p.VPCID, p.VNI, p.RevisionNumber = capi.StatusPending, "", "", 0, 0
	return nil
}
