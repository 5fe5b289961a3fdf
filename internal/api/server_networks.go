package api

import (
	"context"
	"net/http"
)

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
