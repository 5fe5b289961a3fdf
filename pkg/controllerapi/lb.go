package controllerapi

import "time"

// Listener protocols.
const (
	ProtocolTCP  = "TCP"
	ProtocolUDP  = "UDP"
	ProtocolSCTP = "SCTP"
)

// Session persistence types.
const (
	// PersistenceSourceIP pins a client address to one member for
	// SessionPersistence.Timeout seconds after its last packet.
	PersistenceSourceIP = "SOURCE_IP"
)

// Provisioning statuses of a load balancer (Octavia's names). The
// controller stores a load balancer ACTIVE once its transaction commits;
// agents program it from the watch feed.
const (
	ProvisioningActive = "ACTIVE"
	ProvisioningError  = "ERROR"
)

// Operating statuses of a load balancer: ONLINE with at least one member,
// OFFLINE with none (its VIP then rejects connections).
const (
	OperatingOnline  = "ONLINE"
	OperatingOffline = "OFFLINE"
)

// Floating IP statuses: ACTIVE when associated, DOWN when not.
const (
	FIPActive = "ACTIVE"
	FIPDown   = "DOWN"
)

// Subnet purposes (Subnet.Purpose).
const (
	// SubnetPurposePorts (the default, "") holds port addresses, and VIPs too.
	SubnetPurposePorts = ""
	// SubnetPurposeService holds load balancer VIPs only (Kubernetes
	// clusterIPs); creating a port in it is refused. It may lie outside the
	// VPC's CIDR but not overlap the VPC's other subnets.
	SubnetPurposeService = "service"
)

// Listener is one front-end port of a load balancer: connections to
// VIP:Port with Protocol go to a member's address at TargetPort (the
// member's own Port when it has one, see Member). With NodePort set, the
// same listener also answers on that port of every host's node addresses
// (the agents' --nodeport-addresses; Kubernetes' nodePort).
type Listener struct {
	Protocol   string `json:"protocol"`              // TCP, UDP or SCTP
	Port       int    `json:"port"`                  // 1-65535
	TargetPort int    `json:"target_port,omitempty"` // 1-65535; default Port
	NodePort   int    `json:"node_port,omitempty"`   // 1-65535; 0: none
}

// Key names the listener in Member.Listeners: "TCP/80".
func (l Listener) Key() string { return ListenerKey(l.Protocol, l.Port) }

// Member is one back end of a load balancer: an address inside the load
// balancer's VPC, or, with External, an address outside every VPC (a
// host's own address: Kubernetes' API servers and hostNetwork pods),
// which the hosts reach through their own routing. Port, when not 0,
// overrides the TargetPort of the listeners it serves; Listeners, when
// not empty, names the listeners it serves (Listener.Key), else it serves
// all of them. HostID is the host the member runs on (binding:host_id of
// its port): the agents need it for the local-only traffic policies.
// A Backup member gets connections only while no other member of the
// same listener can (for that frontend and policy): Kubernetes' serving
// but terminating endpoints. PortID optionally names the controller port
// that owns Address (informational).
type Member struct {
	Address   string   `json:"address"`
	Port      int      `json:"port,omitempty"`
	PortID    string   `json:"port_id,omitempty"`
	Listeners []string `json:"listeners,omitempty"`
	HostID    string   `json:"host_id,omitempty"`
	Backup    bool     `json:"backup,omitempty"`
	External  bool     `json:"external,omitempty"`
}

// SessionPersistence pins clients to members.
type SessionPersistence struct {
	Type    string `json:"type"`              // SOURCE_IP
	Timeout int    `json:"timeout,omitempty"` // seconds, 1-86400; default 10800 (as kube-proxy)
}

// Policy says where a load balancer answers besides its VIP inside its
// VPC, and which members each kind of frontend uses (Kubernetes' Service
// fields in parentheses). Every agent programs a load balancer whose
// policy adds host-level frontends (HostAccess, ExternalAddresses or a
// listener's NodePort), not only the agents of hosts with a port in its
// VPC.
//
// Internal frontends are the VIP inside the VPC and, with HostAccess, the
// VIP for connections the hosts themselves open. External frontends are
// node ports, ExternalAddresses and floating IPs of the load balancer;
// their connections are source-NATed to the receiving host's node
// address (so that replies come back through it), unless ExternalLocal.
type Policy struct {
	// HostAccess answers the VIP for connections opened on the hosts
	// (processes of the host and of pods sharing its network namespace).
	HostAccess bool `json:"host_access,omitempty"`
	// ExternalAddresses are answered for packets that reach a host on any
	// interface (externalIPs), IPv4.
	ExternalAddresses []string `json:"external_addresses,omitempty"`
	// ExternalLocal sends the connections of external frontends only to
	// members on the receiving host, keeping the client's source address
	// (externalTrafficPolicy: Local).
	ExternalLocal bool `json:"external_local,omitempty"`
	// HealthCheckNodePort, with ExternalLocal, is a TCP port on which every
	// agent answers HTTP GET with 200 while it has a local member and 503
	// otherwise (healthCheckNodePort).
	HealthCheckNodePort int `json:"health_check_node_port,omitempty"`
	// InternalLocal sends the connections of internal frontends only to
	// members on the client's host (internalTrafficPolicy: Local).
	InternalLocal bool `json:"internal_local,omitempty"`
}

// LoadBalancer is a virtual IP in a VPC that spreads connections over
// members. Requests carry ID (optional), Name, Description, VIPSubnetID,
// VIPAddress (optional: allocated from the subnet when empty), Listeners,
// Members and SessionPersistence; the controller fills VPCID, VNI, the
// statuses, RevisionNumber and the timestamps.
type LoadBalancer struct {
	ID                 string              `json:"id,omitempty"`
	ProjectID          string              `json:"project_id,omitempty"`
	Name               string              `json:"name,omitempty"`
	Description        string              `json:"description,omitempty"`
	VIPSubnetID        string              `json:"vip_subnet_id,omitempty"`
	VIPAddress         string              `json:"vip_address,omitempty"`
	Listeners          []Listener          `json:"listeners,omitempty"`
	Members            []Member            `json:"members,omitempty"`
	SessionPersistence *SessionPersistence `json:"session_persistence,omitempty"`
	Policy

	// Filled by the controller.
	VPCID              string    `json:"vpc_id,omitempty"`
	VNI                uint32    `json:"vni,omitempty"`
	ProvisioningStatus string    `json:"provisioning_status,omitempty"`
	OperatingStatus    string    `json:"operating_status,omitempty"`
	RevisionNumber     int64     `json:"revision_number,omitempty"`
	CreatedAt          time.Time `json:"created_at,omitzero"`
	UpdatedAt          time.Time `json:"updated_at,omitzero"`
}

// LoadBalancerUpdate is the body of PUT project/<pid>/loadbalancers/<id>
// (wrapped as {"loadbalancer":{...}}): each field that is not nil replaces
// the stored one. The VIP, its subnet and the id cannot change.
type LoadBalancerUpdate struct {
	Name               *string             `json:"name,omitempty"`
	Description        *string             `json:"description,omitempty"`
	Listeners          *[]Listener         `json:"listeners,omitempty"`
	Members            *[]Member           `json:"members,omitempty"`
	SessionPersistence *SessionPersistence `json:"session_persistence,omitempty"`
	// ClearSessionPersistence removes session persistence.
	ClearSessionPersistence bool `json:"clear_session_persistence,omitempty"`
	// Policy replaces the stored policy as a whole.
	Policy *Policy `json:"policy,omitempty"`
}

// ExternalNetwork is an address range outside every VPC from which
// floating IPs are allocated (the "external network" of Neutron). It
// belongs to no project: operators create it, every project may allocate
// from it. It has no ports; the agents' external interface leads to it.
type ExternalNetwork struct {
	ID              string           `json:"id,omitempty"`
	Name            string           `json:"name,omitempty"`
	Description     string           `json:"description,omitempty"`
	CIDR            string           `json:"cidr,omitempty"`
	IPVersion       int              `json:"ip_version,omitempty"`
	GatewayIP       string           `json:"gateway_ip,omitempty"` // default: first host address
	AllocationPools []AllocationPool `json:"allocation_pools,omitempty"`
	RevisionNumber  int64            `json:"revision_number,omitempty"`
	CreatedAt       time.Time        `json:"created_at,omitzero"`
	UpdatedAt       time.Time        `json:"updated_at,omitzero"`
}

// FloatingIP is an address of an external network that a project holds
// and may associate with one of its ports or load balancers. Requests
// carry ID (optional), FloatingNetworkID, FloatingIPAddress (optional:
// allocated when empty), and at most one of PortID and LoadBalancerID. The
// controller fills FixedIPAddress (the port's address or the load
// balancer's VIP), VPCID and VNI of the associated object, Status,
// RevisionNumber and the timestamps.
type FloatingIP struct {
	ID                string `json:"id,omitempty"`
	ProjectID         string `json:"project_id,omitempty"`
	Description       string `json:"description,omitempty"`
	FloatingNetworkID string `json:"floating_network_id,omitempty"`
	FloatingIPAddress string `json:"floating_ip_address,omitempty"`
	PortID            string `json:"port_id,omitempty"`
	LoadBalancerID    string `json:"loadbalancer_id,omitempty"`

	// Filled by the controller.
	FixedIPAddress string    `json:"fixed_ip_address,omitempty"`
	VPCID          string    `json:"vpc_id,omitempty"`
	VNI            uint32    `json:"vni,omitempty"`
	Status         string    `json:"status,omitempty"`
	RevisionNumber int64     `json:"revision_number,omitempty"`
	CreatedAt      time.Time `json:"created_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
}

// FloatingIPAssociation is the body of PUT
// project/<pid>/floatingips/<id> (wrapped as {"floatingip":{...}}): at
// most one of PortID and LoadBalancerID; both empty disassociates.
type FloatingIPAssociation struct {
	PortID         string `json:"port_id"`
	LoadBalancerID string `json:"loadbalancer_id,omitempty"`
}

// MembersBody is the body of PUT project/<pid>/loadbalancers/<id>/members,
// which replaces the member set (an empty list removes every member).
type MembersBody struct {
	Members []Member `json:"members"`
}

// Request and response envelopes of the load balancer and floating IP
// resources.
type (
	LoadBalancerBody struct {
		LoadBalancer LoadBalancer `json:"loadbalancer"`
	}
	LoadBalancersBody struct {
		LoadBalancers []LoadBalancer `json:"loadbalancers"`
	}
	LoadBalancerUpdateBody struct {
		LoadBalancer LoadBalancerUpdate `json:"loadbalancer"`
	}
	ExternalNetworkBody struct {
		ExternalNetwork ExternalNetwork `json:"external_network"`
	}
	ExternalNetworksBody struct {
		ExternalNetworks []ExternalNetwork `json:"external_networks"`
	}
	FloatingIPBody struct {
		FloatingIP FloatingIP `json:"floatingip"`
	}
	FloatingIPsBody struct {
		FloatingIPs []FloatingIP `json:"floatingips"`
	}
	FloatingIPAssociationBody struct {
		FloatingIP FloatingIPAssociation `json:"floatingip"`
	}
)
