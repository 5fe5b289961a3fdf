package controllerapi

import (
	"encoding/json"
	"time"
)

// Port statuses. A port is PENDING from creation until the agent on its
// binding:host_id reports it plugged (UP) or failed (ERROR), or unplugged
// (DOWN).
const (
	StatusPending = "PENDING"
	StatusUp      = "UP"
	StatusDown    = "DOWN"
	StatusError   = "ERROR"
)

// Watch event types.
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
	// EventSynced ends the replay of current objects that a watch with
	// since=0 starts with; live events follow it.
	EventSynced = "SYNCED"
)

// Project is a tenant: the owner of VPCs, subnets and ports.
type Project struct {
	ID             string    `json:"id,omitempty"`
	Name           string    `json:"name,omitempty"`
	Description    string    `json:"description,omitempty"`
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// VPC is an isolated overlay network (Neutron "network"). The controller
// assigns it a unique 24-bit VXLAN id.
type VPC struct {
	ID             string    `json:"id,omitempty"`
	ProjectID      string    `json:"project_id,omitempty"`
	Name           string    `json:"name,omitempty"`
	Description    string    `json:"description,omitempty"`
	CIDR           string    `json:"cidr,omitempty"`
	VNI            uint32    `json:"vni,omitempty"`
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// AllocationPool is an inclusive range of addresses the controller may hand
// out in a subnet.
type AllocationPool struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// Subnet is an address range inside a VPC from which ports get addresses.
type Subnet struct {
	ID              string           `json:"id,omitempty"`
	ProjectID       string           `json:"project_id,omitempty"`
	Name            string           `json:"name,omitempty"`
	Description     string           `json:"description,omitempty"`
	NetworkID       string           `json:"network_id,omitempty"` // the VPC id
	CIDR            string           `json:"cidr,omitempty"`
	IPVersion       int              `json:"ip_version,omitempty"` // 4 or 6; derived from cidr when 0
	GatewayIP       string           `json:"gateway_ip,omitempty"` // default: first host address
	AllocationPools []AllocationPool `json:"allocation_pools,omitempty"`
	DNSNameservers  []string         `json:"dns_nameservers,omitempty"`
	// Purpose is "" for a subnet of ports (which may hold load balancer
	// VIPs too) or "service" for a subnet of VIPs only (SubnetPurposeService).
	Purpose        string    `json:"purpose,omitempty"`
	VNI            uint32    `json:"vni,omitempty"` // the VPC's, in responses
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// FixedIP is one address of a port. In requests only SubnetID and
// IPAddress are read (either may be empty); CIDR and GatewayIP are filled in
// responses as a convenience for agents and CNI plugins.
type FixedIP struct {
	SubnetID  string `json:"subnet_id,omitempty"`
	IPAddress string `json:"ip_address,omitempty"`
	CIDR      string `json:"cidr,omitempty"`
	GatewayIP string `json:"gateway_ip,omitempty"`
}

// AddressPair is an extra address (and optional MAC) a port may use.
// Spec 003 sends empty objects ({}); they are accepted and dropped.
type AddressPair struct {
	IPAddress  string `json:"ip_address,omitempty"`
	MACAddress string `json:"mac_address,omitempty"`
}

// Port is a virtual NIC. Requests carry the fields spec 003 shows; the
// controller fills in Status, MACAddress (unless given), FixedIPs (allocated
// unless requested), VPCID, VNI, RevisionNumber and the timestamps.
type Port struct {
	ID          string `json:"id,omitempty"` // client-chosen or generated
	ProjectID   string `json:"project_id,omitempty"`
	TenantID    string `json:"tenant_id,omitempty"` // Neutron alias, accepted and ignored
	Name        string `json:"name,omitempty"`
	Description string `json:"description,omitempty"`
	// NetworkID names a subnet (as the spec's CNI plugin sends) or a VPC.
	NetworkID   string `json:"network_id,omitempty"`
	DeviceID    string `json:"device_id,omitempty"`
	DeviceOwner string `json:"device_owner,omitempty"`
	VethName    string `json:"veth_name,omitempty"`
	// NetworkNS is the netns path the agent moves the NIC into. Spec 003's
	// bulk example calls it veth_namespace; both are accepted and the
	// controller copies one into the other so responses carry both.
	NetworkNS           string          `json:"network_ns,omitempty"`
	VethNamespace       string          `json:"veth_namespace,omitempty"`
	DNSDomain           string          `json:"dns_domain,omitempty"`
	DNSName             string          `json:"dns_name,omitempty"`
	AdminStateUp        *bool           `json:"admin_state_up,omitempty"`
	PortSecurityEnabled *bool           `json:"port_security_enabled,omitempty"`
	AllowedAddressPairs []AddressPair   `json:"allowed_address_pairs,omitempty"`
	SecurityGroups      []string        `json:"security_groups,omitempty"`
	BindingHostID       string          `json:"binding:host_id,omitempty"`
	BindingProfile      json.RawMessage `json:"binding:profile,omitempty"`
	BindingVNICType     string          `json:"binding:vnic_type,omitempty"` // normal (default), macvtap, direct, baremetal, smart-nic
	FastPath            *bool           `json:"fast_path,omitempty"`

	// Filled by the controller.
	Status         string    `json:"status,omitempty"`
	StatusReason   string    `json:"status_reason,omitempty"`
	MACAddress     string    `json:"mac_address,omitempty"`
	FixedIPs       []FixedIP `json:"fixed_ips,omitempty"`
	VPCID          string    `json:"vpc_id,omitempty"`
	VNI            uint32    `json:"vni,omitempty"`
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// Host is a machine running a Kurma agent, known by the id CNI configs
// call hostId and ports call binding:host_id.
type Host struct {
	ID             string    `json:"id"`
	UnderlayIP     string    `json:"underlay_ip"`
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// PortStatusUpdate is the body of PUT project/<pid>/ports/<id>/status.
type PortStatusUpdate struct {
	Status       string `json:"status"`
	StatusReason string `json:"status_reason,omitempty"`
}

// PortBindingUpdate is the body of PUT project/<pid>/ports/<id>/binding,
// which binds the port to another host (binding:host_id; empty: none),
// keeping its addresses and MAC: a node whose agent's host id changed
// keeps its running pods' ports. The port goes back to PENDING until the
// new host's agent reports it; the old host's port watch sees it
// DELETED.
type PortBindingUpdate struct {
	BindingHostID string `json:"binding:host_id"`
}

// Event is one line of a watch stream. Port is set on port watches, Host on
// host watches, LoadBalancer or FloatingIP on load balancer watches
// (WatchLoadBalancers); SYNCED events carry none. A DELETED event carries
// the object as it was last stored.
type Event struct {
	Type         string        `json:"type"`
	Revision     int64         `json:"revision"`
	Port         *Port         `json:"port,omitempty"`
	Host         *Host         `json:"host,omitempty"`
	LoadBalancer *LoadBalancer `json:"loadbalancer,omitempty"`
	FloatingIP   *FloatingIP   `json:"floatingip,omitempty"`
}

// Request and response envelopes.
type (
	ProjectBody struct {
		Project Project `json:"project"`
	}
	ProjectsBody struct {
		Projects []Project `json:"projects"`
	}
	VPCBody struct {
		VPC VPC `json:"vpc"`
	}
	VPCsBody struct {
		VPCs []VPC `json:"vpcs"`
	}
	SubnetBody struct {
		Subnet Subnet `json:"subnet"`
	}
	SubnetsBody struct {
		Subnets []Subnet `json:"subnets"`
	}
	PortBody struct {
		Port Port `json:"port"`
	}
	PortsBody struct {
		Ports []Port `json:"ports"`
	}
	HostBody struct {
		Host Host `json:"host"`
	}
	HostsBody struct {
		Hosts []Host `json:"hosts"`
	}
)

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail: Type is a kerrors category name ("NotFound", "Conflict",
// "Invalid", "Unauthorized", "Unavailable", "Exhausted", "Internal"), or
// "Gone" for a compacted watch revision.
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// PortFilter selects ports in ListPorts; empty fields match everything.
type PortFilter struct {
	HostID    string // binding:host_id
	DeviceID  string
	Name      string
	NetworkID string
}
