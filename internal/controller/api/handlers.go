package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"kurma.dev/kurma/internal/controller/core"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Every handler here decodes the request, calls the core and encodes its
// answer; the rules live in the core.

// decodeBody reads the body and decodes it as {"<key>":{...}}.
func decodeBody[T any](r *http.Request, key string) (T, error) {
	b, err := readBody(r)
	if err != nil {
		var zero T
		return zero, err
	}
	return decodeWrapped[T](b, key)
}

func ok(w http.ResponseWriter) error { return writeJSON(w, http.StatusOK, struct{}{}) }

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	p, err := decodeBody[capi.Project](r, "project")
	if err != nil {
		return err
	}
	if p, err = s.core.CreateProject(r.Context(), p); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, capi.ProjectBody{Project: p})
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) error {
	p, err := s.core.GetProject(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.ProjectBody{Project: p})
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListProjects(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.ProjectsBody{Projects: out})
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteProject(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

// checkProject fails a request under an unknown project before its body
// is read (a body error would otherwise hide the 404).
func (s *Server) checkProject(r *http.Request) (string, error) {
	pid := r.PathValue("pid")
	return pid, s.core.RequireProject(r.Context(), pid)
}

func (s *Server) createVPC(w http.ResponseWriter, r *http.Request) error {
	pid, err := s.checkProject(r)
	if err != nil {
		return err
	}
	v, err := decodeBody[capi.VPC](r, "vpc")
	if err != nil {
		return err
	}
	if v, err = s.core.CreateVPC(r.Context(), pid, v); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, capi.VPCBody{VPC: v})
}

func (s *Server) getVPC(w http.ResponseWriter, r *http.Request) error {
	v, err := s.core.GetVPC(r.Context(), r.PathValue("pid"), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.VPCBody{VPC: v})
}

func (s *Server) listVPCs(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListVPCs(r.Context(), r.PathValue("pid"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.VPCsBody{VPCs: out})
}

func (s *Server) deleteVPC(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteVPC(r.Context(), r.PathValue("pid"), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

func (s *Server) createSubnet(w http.ResponseWriter, r *http.Request) error {
	pid, err := s.checkProject(r)
	if err != nil {
		return err
	}
	sn, err := decodeBody[capi.Subnet](r, "subnet")
	if err != nil {
		return err
	}
	if sn, err = s.core.CreateSubnet(r.Context(), pid, sn); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, capi.SubnetBody{Subnet: sn})
}

func (s *Server) getSubnet(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.core.GetSubnet(r.Context(), r.PathValue("pid"), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.SubnetBody{Subnet: sn})
}

func (s *Server) listSubnets(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListSubnets(r.Context(), r.PathValue("pid"), r.URL.Query().Get("network_id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.SubnetsBody{Subnets: out})
}

func (s *Server) deleteSubnet(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteSubnet(r.Context(), r.PathValue("pid"), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

// parseWait reads wait_status and timeout; zero duration means no wait.
func (s *Server) parseWait(r *http.Request) (string, time.Duration, error) {
	q := r.URL.Query()
	ws, ts := q.Get("wait_status"), q.Get("timeout")
	if ws == "" && ts == "" {
		return "", 0, nil
	}
	switch ws {
	case "", capi.StatusUp, capi.StatusDown, capi.StatusError:
	default:
		return "", 0, kerrors.New(kerrors.Invalid, "wait_status %q: want UP, DOWN or ERROR", ws)
	}
	d := 60 * time.Second
	if ts != "" {
		var err error
		if d, err = time.ParseDuration(ts); err != nil {
			n, nerr := strconv.Atoi(ts)
			if nerr != nil {
				return "", 0, kerrors.New(kerrors.Invalid, "timeout %q: want a duration such as 60s", ts)
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 {
			return "", 0, kerrors.New(kerrors.Invalid, "timeout %q is negative", ts)
		}
	}
	return ws, min(d, s.maxWait), nil
}

func (s *Server) createPorts(w http.ResponseWriter, r *http.Request) error {
	pid, err := s.checkProject(r)
	if err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	ports, bulk, err := DecodePorts(b)
	if err != nil {
		return err
	}
	// ?wait_status=&timeout= on a single create: answer once the new port
	// has left PENDING (as GET with the same query does), so a CNI ADD
	// needs one request instead of a create and then a long poll.
	ws, d, err := s.parseWait(r)
	if err != nil {
		return err
	}
	if bulk && d > 0 {
		return kerrors.New(kerrors.Invalid, "wait_status and timeout apply to single-port creates only")
	}
	out, err := s.core.CreatePorts(r.Context(), pid, ports)
	if err != nil {
		return err
	}
	if bulk {
		return writeJSON(w, http.StatusCreated, capi.PortsBody{Ports: out})
	}
	p := out[0]
	if d > 0 {
		if p, err = s.core.WaitPort(r.Context(), pid, p.ID, ws, d); err != nil {
			return err
		}
	}
	return writeJSON(w, http.StatusCreated, capi.PortBody{Port: p})
}

func (s *Server) getPort(w http.ResponseWriter, r *http.Request) error {
	pid, id := r.PathValue("pid"), r.PathValue("id")
	if _, err := s.checkProject(r); err != nil {
		return err
	}
	if err := core.ValidID("port", id); err != nil {
		return err
	}
	ws, d, err := s.parseWait(r)
	if err != nil {
		return err
	}
	var p capi.Port
	if d == 0 {
		p, err = s.core.GetPort(r.Context(), pid, id)
	} else {
		p, err = s.core.WaitPort(r.Context(), pid, id, ws, d)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortBody{Port: p})
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := capi.PortFilter{HostID: q.Get("binding:host_id"), DeviceID: q.Get("device_id"), Name: q.Get("name"), NetworkID: q.Get("network_id")}
	out, err := s.core.ListPorts(r.Context(), r.PathValue("pid"), f)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortsBody{Ports: out})
}

func (s *Server) deletePort(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeletePort(r.Context(), r.PathValue("pid"), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}

func (s *Server) setPortStatus(w http.ResponseWriter, r *http.Request) error {
	return updatePort(s, w, r, DecodeStatus, s.core.SetPortStatus)
}

func (s *Server) setPortBinding(w http.ResponseWriter, r *http.Request) error {
	return updatePort(s, w, r, DecodeBinding, s.core.SetPortBinding)
}

// updatePort is the handler of a PUT on one field group of a port (its
// status, its binding): the project checked, the body decoded, the
// update applied by core, the port answered.
func updatePort[U any](s *Server, w http.ResponseWriter, r *http.Request, decode func([]byte) (U, error),
	apply func(ctx context.Context, pid, id string, u U) (capi.Port, error)) error {
	pid, id := r.PathValue("pid"), r.PathValue("id")
	if _, err := s.checkProject(r); err != nil {
		return err
	}
	if err := core.ValidID("port", id); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	u, err := decode(b)
	if err != nil {
		return err
	}
	p, err := apply(r.Context(), pid, id, u)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.PortBody{Port: p})
}

func (s *Server) putHost(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := core.ValidID("host", id); err != nil {
		return err
	}
	b, err := readBody(r)
	if err != nil {
		return err
	}
	h, err := DecodeHost(id, b)
	if err != nil {
		return err
	}
	if h, err = s.core.PutHost(r.Context(), h); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.HostBody{Host: h})
}

func (s *Server) getHost(w http.ResponseWriter, r *http.Request) error {
	h, err := s.core.GetHost(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.HostBody{Host: h})
}

func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) error {
	out, err := s.core.ListHosts(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, capi.HostsBody{Hosts: out})
}

func (s *Server) deleteHost(w http.ResponseWriter, r *http.Request) error {
	if err := s.core.DeleteHost(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	return ok(w)
}
