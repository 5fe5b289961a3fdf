package api

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// DefaultGrace is the stop grace period when the caller names none.
const DefaultGrace = 10 * time.Second

func (s *Server) handleCreatePod(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeCreatePodRequest(r.Body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Spec.Name == "" {
		req.Spec.Name = generateName(req.Spec.Apps[0])
	}
	if req.Wait {
		s.runPod(w, r, req)
		return
	}
	p, err := s.pods.Create(r.Context(), req.Spec)
	if err != nil {
		s.writeError(w, r, err) // the pod manager's error says "create pod NAME"
		return
	}
	s.writeJSON(w, http.StatusCreated, p)
}

// generateName derives a pod name from the first app: its name, or the last
// path element of its image without tag, plus random hex.
func generateName(a pod.AppSpec) string {
	base := a.Name
	if base == "" {
		img := a.Image
		if i := strings.Index(img, "://"); i >= 0 {
			img = img[i+3:]
		}
		base = path.Base(strings.TrimRight(img, "/"))
		if i := strings.IndexAny(base, ":@"); i > 0 {
			base = base[:i]
		}
		base = strings.TrimSuffix(base, ".aci")
	}
	var b strings.Builder
	for _, c := range base {
		if c < 128 && (c == '-' || c == '_' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b.WriteRune(c)
		}
	}
	n := strings.TrimLeft(b.String(), "-_.")
	if len(n) > 40 {
		n = n[:40]
	}
	if n == "" {
		n = "pod"
	}
	rb := make([]byte, 3)
	_, _ = rand.Read(rb)
	return n + "-" + hex.EncodeToString(rb)
}

func (s *Server) handleListPods(w http.ResponseWriter, r *http.Request) {
	pods, err := s.pods.List(r.Context())
	if err != nil {
		s.writeError(w, r, fmt.Errorf("list pods: %w", err))
		return
	}
	if pods == nil {
		pods = []*pod.Pod{}
	}
	s.writeJSON(w, http.StatusOK, pods)
}

func (s *Server) handleGetPod(w http.ResponseWriter, r *http.Request) {
	p, err := s.pods.Get(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, p)
}

func (s *Server) handleStopPod(w http.ResponseWriter, r *http.Request) {
	req := StopRequest{GraceSeconds: -1}
	if r.ContentLength != 0 {
		if err := decodeJSON(r.Body, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	grace := DefaultGrace
	if req.GraceSeconds >= 0 {
		grace = time.Duration(req.GraceSeconds) * time.Second
	}
	if err := s.pods.Stop(r.Context(), r.PathValue("ref"), grace); err != nil {
		s.writeError(w, r, err) // the pod manager names the pod
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRemovePod(w http.ResponseWriter, r *http.Request) {
	force, err := boolParam(r, "force")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.pods.Remove(r.Context(), r.PathValue("ref"), force); err != nil {
		s.writeError(w, r, err) // the pod manager names the pod
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handlePodStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.pods.Status(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.writeError(w, r, fmt.Errorf("pod status: %w", err))
		return
	}
	s.writeJSON(w, http.StatusOK, st)
}

// handleLogs streams an app's log as raw bytes; a failure after the first
// byte is reported in the Kurma-Error trailer.
func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) {
	follow, err := boolParam(r, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ref := r.PathValue("ref")
	_, app, err := s.resolveApp(r, ref, r.URL.Query().Get("app"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Trailer", ErrorTrailer)
	fw := &flushWriter{w: w, rc: http.NewResponseController(w)}
	err = s.pods.Logs(r.Context(), ref, app, follow, fw)
	if err != nil && r.Context().Err() == nil {
		if !fw.wrote {
			s.writeError(w, r, fmt.Errorf("logs: %w", err))
			return
		}
		w.Header().Set(ErrorTrailer, string(mustJSON(errorBody(err))))
	}
}

// flushWriter flushes after every write so followers see lines at once.
type flushWriter struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	wrote bool
}

func (f *flushWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f.wrote = true
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// resolveApp finds the pod and picks the app: the one named, or the only one.
func (s *Server) resolveApp(r *http.Request, ref, app string) (*pod.Pod, string, error) {
	p, err := s.pods.Get(r.Context(), ref)
	if err != nil {
		return nil, "", err
	}
	if app == "" {
		if len(p.Apps) != 1 {
			names := make([]string, len(p.Apps))
			for i, a := range p.Apps {
				names[i] = a.Name
			}
			return nil, "", kerrors.New(kerrors.Invalid, "pod %s has %d apps (%s): name one", p.Name, len(p.Apps), strings.Join(names, ", "))
		}
		return p, p.Apps[0].Name, nil
	}
	for _, a := range p.Apps {
		if a.Name == app {
			return p, app, nil
		}
	}
	return nil, "", kerrors.New(kerrors.NotFound, "pod %s has no app %q", p.Name, app)
}

func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, kerrors.New(kerrors.Invalid, "query parameter %s=%q is not a boolean", name, v)
	}
	return b, nil
}
