package api

import (
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// lbsRequest is the body of POST project/<pid>/loadbalancers: exactly one
// of loadbalancer and loadbalancers.
type lbsRequest struct {
	LoadBalancer  *capi.LoadBalancer  `json:"loadbalancer"`
	LoadBalancers []capi.LoadBalancer `json:"loadbalancers"`
}

// DecodeLoadBalancers parses a single or bulk load-balancer create body;
// bulk reports whether it was {"loadbalancers":[...]}. Unknown keys are
// refused, naming the field.
func DecodeLoadBalancers(b []byte) (lbs []capi.LoadBalancer, bulk bool, err error) {
	var req lbsRequest
	if err := decodeStrict(b, &req); err != nil {
		return nil, false, err
	}
	switch {
	case req.LoadBalancer != nil && req.LoadBalancers != nil:
		return nil, false, kerrors.New(kerrors.Invalid, `give "loadbalancer" or "loadbalancers", not both`)
	case req.LoadBalancer != nil:
		return []capi.LoadBalancer{*req.LoadBalancer}, false, nil
	case req.LoadBalancers != nil:
		if len(req.LoadBalancers) == 0 {
			return nil, true, kerrors.New(kerrors.Invalid, `"loadbalancers" is empty`)
		}
		if len(req.LoadBalancers) > maxBulk {
			return nil, true, kerrors.New(kerrors.Invalid, "bulk of %d load balancers exceeds %d", len(req.LoadBalancers), maxBulk)
		}
		return req.LoadBalancers, true, nil
	}
	return nil, false, kerrors.New(kerrors.Invalid, `body must be {"loadbalancer":{...}} or {"loadbalancers":[...]}`)
}

// DecodeLoadBalancerUpdate parses a PUT project/<pid>/loadbalancers/<id>
// body.
func DecodeLoadBalancerUpdate(b []byte) (capi.LoadBalancerUpdate, error) {
	return decodeWrapped[capi.LoadBalancerUpdate](b, "loadbalancer")
}

// DecodeMembers parses a PUT .../members body: {"members":[...]}, where
// an empty list is allowed and a missing one is not.
func DecodeMembers(b []byte) ([]capi.Member, error) {
	var req struct {
		Members *[]capi.Member `json:"members"`
	}
	if err := decodeStrict(b, &req); err != nil {
		return nil, err
	}
	if req.Members == nil {
		return nil, kerrors.New(kerrors.Invalid, `body must be {"members":[...]}`)
	}
	if *req.Members == nil {
		return []capi.Member{}, nil
	}
	return *req.Members, nil
}

// DecodeExternalNetwork parses a POST external-networks body.
func DecodeExternalNetwork(b []byte) (capi.ExternalNetwork, error) {
	return decodeWrapped[capi.ExternalNetwork](b, "external_network")
}

// DecodeFloatingIP parses a POST project/<pid>/floatingips body.
func DecodeFloatingIP(b []byte) (capi.FloatingIP, error) {
	return decodeWrapped[capi.FloatingIP](b, "floatingip")
}

// DecodeFloatingIPAssociation parses a PUT project/<pid>/floatingips/<id>
// body; port_id null or "" with no loadbalancer_id disassociates.
func DecodeFloatingIPAssociation(b []byte) (capi.FloatingIPAssociation, error) {
	return decodeWrapped[capi.FloatingIPAssociation](b, "floatingip")
}
