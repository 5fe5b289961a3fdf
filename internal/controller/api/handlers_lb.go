package api

import (
	"net/http"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

func (s *Server) createLBs(w http.ResponseWriter, r *http.Request) error {
	pid, err := s.checkProject(r)
	if err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	lbs, bulk, err := DecodeLoadBalancers(b)
	if err != nil {
		return err
	}
	out, err := s.core.CreateLoadBalancers(r.Context(), pid, lbs)
	if err != nil {
		return err
	}
	if bulk {
		return writeJSON(w, http.StatusCreated, capi.LoadBalancersBody{LoadBalancers: out})
	}
	return writeJSON(w, http.StatusCreated, capi.LoadBalancerBody{LoadBalancer: out[0]})
}

func (s *Server) getLB(w http.ResponseWriter, r *http.Request) error {
	lb, err := s.core.GetLoadBalancer(r.Context(), r.PathValue("pid"), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.LoadBalancerBody{LoadBalancer: lb})
}

func (s *Server) listLBs(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListLoadBalancers(r.Context(), r.PathValue("pid"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.LoadBalancersBody{LoadBalancers: out})
}

func (s *Server) updateLB(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.checkProject(r); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	u, err := DecodeLoadBalancerUpdate(b)
	if err != nil {
		return err
	}
	lb, err := s.core.UpdateLoadBalancer(r.Context(), r.PathValue("pid"), r.PathValue("id"), u)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.LoadBalancerBody{LoadBalancer: lb})
}

func (s *Server) setMembers(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.checkProject(r); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	ms, err := DecodeMembers(b)
	if err != nil {
		return err
	}
	lb, err := s.core.SetMembers(r.Context(), r.PathValue("pid"), r.PathValue("id"), ms)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.LoadBalancerBody{LoadBalancer: lb})
}

func (s *Server) deleteLB(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteLoadBalancer(r.Context(), r.PathValue("pid"), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

func (s *Server) createExtnet(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	n, err := DecodeExternalNetwork(b)
	if err != nil {
		return err
	}
	if n, err = s.core.CreateExternalNetwork(r.Context(), n); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, capi.ExternalNetworkBody{ExternalNetwork: n})
}

func (s *Server) getExtnet(w http.ResponseWriter, r *http.Request) error {
	n, err := s.core.GetExternalNetwork(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.ExternalNetworkBody{ExternalNetwork: n})
}

func (s *Server) listExtnets(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListExternalNetworks(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.ExternalNetworksBody{ExternalNetworks: out})
}

func (s *Server) deleteExtnet(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteExternalNetwork(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

func (s *Server) createFIP(w http.ResponseWriter, r *http.Request) error {
	pid, err := s.checkProject(r)
	if err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	f, err := DecodeFloatingIP(b)
	if err != nil {
		return err
	}
	if f, err = s.core.CreateFloatingIP(r.Context(), pid, f); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, capi.FloatingIPBody{FloatingIP: f})
}

func (s *Server) getFIP(w http.ResponseWriter, r *http.Request) error {
	f, err := s.core.GetFloatingIP(r.Context(), r.PathValue("pid"), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.FloatingIPBody{FloatingIP: f})
}

func (s *Server) listFIPs(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListFloatingIPs(r.Context(), r.PathValue("pid"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.FloatingIPsBody{FloatingIPs: out})
}

func (s *Server) associateFIP(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.checkProject(r); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	a, err := DecodeFloatingIPAssociation(b)
	if err != nil {
		return err
	}
	f, err := s.core.AssociateFloatingIP(r.Context(), r.PathValue("pid"), r.PathValue("id"), a)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.FloatingIPBody{FloatingIP: f})
}

func (s *Server) deleteFIP(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteFloatingIP(r.Context(), r.PathValue("pid"), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}
