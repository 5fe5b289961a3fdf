package controllerapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"kurma.dev/kurma/pkg/kerrors"
)

// Load balancers.

func lbPath(projectID string) string { return "project/" + esc(projectID) + "/loadbalancers" }

// CreateLoadBalancer creates one load balancer; its VIP is allocated from
// lb.VIPSubnetID unless lb.VIPAddress names one (in use: kerrors.Conflict;
// outside the subnet: kerrors.Invalid).
func (c *Client) CreateLoadBalancer(ctx context.Context, projectID string, lb LoadBalancer) (*LoadBalancer, error) {
	var out LoadBalancerBody
	if err := c.do(ctx, http.MethodPost, lbPath(projectID), nil, LoadBalancerBody{lb}, &out); err != nil {
		return nil, err
	}
	return &out.LoadBalancer, nil
}

// CreateLoadBalancers creates load balancers in bulk, all or nothing.
func (c *Client) CreateLoadBalancers(ctx context.Context, projectID string, lbs []LoadBalancer) ([]LoadBalancer, error) {
	var out LoadBalancersBody
	if err := c.do(ctx, http.MethodPost, lbPath(projectID), nil, LoadBalancersBody{lbs}, &out); err != nil {
		return nil, err
	}
	return out.LoadBalancers, nil
}

func (c *Client) GetLoadBalancer(ctx context.Context, projectID, id string) (*LoadBalancer, error) {
	var out LoadBalancerBody
	if err := c.do(ctx, http.MethodGet, lbPath(projectID)+"/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.LoadBalancer, nil
}

// ListLoadBalancers lists a project's load balancers.
func (c *Client) ListLoadBalancers(ctx context.Context, projectID string) ([]LoadBalancer, error) {
	var out LoadBalancersBody
	err := c.do(ctx, http.MethodGet, lbPath(projectID), nil, nil, &out)
	return out.LoadBalancers, err
}

// EachLoadBalancer calls fn with each of a project's load balancers as
// the listing is decoded, one at a time: a caller that keeps a digest of
// each never holds the whole listing (tens of thousands of load
// balancers). The *LoadBalancer is reused for the next; fn must not keep
// it. An error from fn stops the listing and is returned.
func (c *Client) EachLoadBalancer(ctx context.Context, projectID string, fn func(*LoadBalancer) error) error {
	path := lbPath(projectID)
	req, err := c.newRequest(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("GET %s: %w", path, err)
		}
		return fmt.Errorf("GET %s: %w", path, kerrors.New(kerrors.Unavailable, "%v", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(http.MethodGet, path, resp)
	}
	var lb LoadBalancer
	err = EachInArray(resp.Body, "loadbalancers", func(dec *json.Decoder) error {
		lb = LoadBalancer{}
		if err := dec.Decode(&lb); err != nil {
			return err
		}
		return fn(&lb)
	})
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// EachInArray reads a JSON object from r and calls elem for each element
// of its array member field, with the decoder positioned at the element
// (elem must decode exactly one value). Other members are skipped; a
// missing or null field calls elem never. Only one element is in memory
// at a time.
func EachInArray(r io.Reader, field string, elem func(dec *json.Decoder) error) error {
	dec := json.NewDecoder(r)
	if err := expectDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		name, _ := t.(string)
		if name != field {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return fmt.Errorf("decode response: %w", err)
			}
			continue
		}
		t, err = dec.Token()
		if err != nil {
			return fmt.Errorf("decode response: %w", err)
		}
		if t == nil {
			continue // null
		}
		if d, ok := t.(json.Delim); !ok || d != '[' {
			return fmt.Errorf("decode response: %s is %v, want an array", field, t)
		}
		for dec.More() {
			if err := elem(dec); err != nil {
				return err
			}
		}
		if err := expectDelim(dec, ']'); err != nil {
			return err
		}
	}
	return expectDelim(dec, '}')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("decode response: got %v, want %v", t, want)
	}
	return nil
}

// ListAllLoadBalancers lists the load balancers of every project (what an
// agent reconciles against; WatchLoadBalancers starts with the same list).
func (c *Client) ListAllLoadBalancers(ctx context.Context) ([]LoadBalancer, error) {
	var out LoadBalancersBody
	err := c.do(ctx, http.MethodGet, "loadbalancers", nil, nil, &out)
	return out.LoadBalancers, err
}

// UpdateLoadBalancer replaces the fields of u that are set.
func (c *Client) UpdateLoadBalancer(ctx context.Context, projectID, id string, u LoadBalancerUpdate) (*LoadBalancer, error) {
	var out LoadBalancerBody
	if err := c.do(ctx, http.MethodPut, lbPath(projectID)+"/"+esc(id), nil, LoadBalancerUpdateBody{u}, &out); err != nil {
		return nil, err
	}
	return &out.LoadBalancer, nil
}

// SetMembers replaces the member set of a load balancer in one request;
// an empty set removes every member.
func (c *Client) SetMembers(ctx context.Context, projectID, id string, members []Member) (*LoadBalancer, error) {
	if members == nil {
		members = []Member{}
	}
	var out LoadBalancerBody
	if err := c.do(ctx, http.MethodPut, lbPath(projectID)+"/"+esc(id)+"/members", nil, MembersBody{members}, &out); err != nil {
		return nil, err
	}
	return &out.LoadBalancer, nil
}

// DeleteLoadBalancer deletes a load balancer, releases its VIP and
// disassociates its floating IPs, all in one transaction.
func (c *Client) DeleteLoadBalancer(ctx context.Context, projectID, id string) error {
	return c.do(ctx, http.MethodDelete, lbPath(projectID)+"/"+esc(id), nil, nil, nil)
}

// WatchLoadBalancers streams load balancer and floating IP events after
// revision since (0: every current load balancer and floating IP as ADDED,
// then SYNCED, then live events). Each event carries LoadBalancer or
// FloatingIP. Errors and the end of iteration are as in WatchPorts.
func (c *Client) WatchLoadBalancers(ctx context.Context, since int64) iter.Seq2[Event, error] {
	return c.watch(ctx, "watch/loadbalancers", url.Values{"since": {strconv.FormatInt(since, 10)}})
}

// External networks.

// CreateExternalNetwork creates an external network (no project).
func (c *Client) CreateExternalNetwork(ctx context.Context, n ExternalNetwork) (*ExternalNetwork, error) {
	var out ExternalNetworkBody
	if err := c.do(ctx, http.MethodPost, "external-networks", nil, ExternalNetworkBody{n}, &out); err != nil {
		return nil, err
	}
	return &out.ExternalNetwork, nil
}

func (c *Client) GetExternalNetwork(ctx context.Context, id string) (*ExternalNetwork, error) {
	var out ExternalNetworkBody
	if err := c.do(ctx, http.MethodGet, "external-networks/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.ExternalNetwork, nil
}

func (c *Client) ListExternalNetworks(ctx context.Context) ([]ExternalNetwork, error) {
	var out ExternalNetworksBody
	err := c.do(ctx, http.MethodGet, "external-networks", nil, nil, &out)
	return out.ExternalNetworks, err
}

// DeleteExternalNetwork deletes an external network that holds no
// floating IP (else kerrors.Conflict).
func (c *Client) DeleteExternalNetwork(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "external-networks/"+esc(id), nil, nil, nil)
}

// Floating IPs.

func fipPath(projectID string) string { return "project/" + esc(projectID) + "/floatingips" }

// CreateFloatingIP allocates a floating IP from f.FloatingNetworkID, the
// address f.FloatingIPAddress when given (in use: kerrors.Conflict), and
// associates it when f.PortID or f.LoadBalancerID is set.
func (c *Client) CreateFloatingIP(ctx context.Context, projectID string, f FloatingIP) (*FloatingIP, error) {
	var out FloatingIPBody
	if err := c.do(ctx, http.MethodPost, fipPath(projectID), nil, FloatingIPBody{f}, &out); err != nil {
		return nil, err
	}
	return &out.FloatingIP, nil
}

func (c *Client) GetFloatingIP(ctx context.Context, projectID, id string) (*FloatingIP, error) {
	var out FloatingIPBody
	if err := c.do(ctx, http.MethodGet, fipPath(projectID)+"/"+esc(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out.FloatingIP, nil
}

// ListFloatingIPs lists a project's floating IPs.
func (c *Client) ListFloatingIPs(ctx context.Context, projectID string) ([]FloatingIP, error) {
	var out FloatingIPsBody
	err := c.do(ctx, http.MethodGet, fipPath(projectID), nil, nil, &out)
	return out.FloatingIPs, err
}

// ListAllFloatingIPs lists the floating IPs of every project.
func (c *Client) ListAllFloatingIPs(ctx context.Context) ([]FloatingIP, error) {
	var out FloatingIPsBody
	err := c.do(ctx, http.MethodGet, "floatingips", nil, nil, &out)
	return out.FloatingIPs, err
}

// AssociateFloatingIP points a floating IP at a port or a load balancer
// (exactly one of a.PortID and a.LoadBalancerID), replacing any previous
// association.
func (c *Client) AssociateFloatingIP(ctx context.Context, projectID, id string, a FloatingIPAssociation) (*FloatingIP, error) {
	var out FloatingIPBody
	if err := c.do(ctx, http.MethodPut, fipPath(projectID)+"/"+esc(id), nil, FloatingIPAssociationBody{a}, &out); err != nil {
		return nil, err
	}
	return &out.FloatingIP, nil
}

// DisassociateFloatingIP removes a floating IP's association; the address
// stays allocated to the project.
func (c *Client) DisassociateFloatingIP(ctx context.Context, projectID, id string) (*FloatingIP, error) {
	return c.AssociateFloatingIP(ctx, projectID, id, FloatingIPAssociation{})
}

// DeleteFloatingIP releases a floating IP.
func (c *Client) DeleteFloatingIP(ctx context.Context, projectID, id string) error {
	return c.do(ctx, http.MethodDelete, fipPath(projectID)+"/"+esc(id), nil, nil, nil)
}
