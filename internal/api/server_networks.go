package api

import (
	"context"
	"net/http"
)

// NetworkInfo is one entry of GET /v1/networks: a configured pod network
// and the state of its plugin container ("starting", "running", "failed").
type NetworkInfo struct {
	Name     string `json:"name"`
	Image    string `json:"image"`
	Default  bool   `json:"default"`
	State    string `json:"state"`
	Error    string `json:"error,omitempty"`
	Restarts int    `json:"restarts,omitempty"`
}

// NetworkLister is what GET /v1/networks reads (kurmad adapts the network
// manager to it).
type NetworkLister interface {
	ListNetworks(ctx context.Context) []NetworkInfo
}

func (s *Server) handleListNetworks(w http.ResponseWriter, r *http.Request) {
	nets := []NetworkInfo{}
	if s.networks != nil {
		nets = append(nets, s.networks.ListNetworks(r.Context())...)
	}
	s.writeJSON(w, http.StatusOK, nets)
}

// ListNetworks lists the daemon's pod networks and their states.
func (c *Client) ListNetworks(ctx context.Context) ([]NetworkInfo, error) {
	var nets []NetworkInfo
	err := c.do(ctx, http.MethodGet, "/networks", nil, nil, &nets)
	return nets, err
}
