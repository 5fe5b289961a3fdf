package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/pkg/kerrors"
)

// handlePull streams NDJSON PullEvents: progress lines, then the image or
// an error. Errors found before the pull starts are ordinary error replies.
func (s *Server) handlePull(w http.ResponseWriter, r *http.Request) {
	var req PullRequest
	if err := decodeJSON(r.Body, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if strings.TrimSpace(req.URI) == "" {
		s.writeError(w, r, kerrors.New(kerrors.Invalid, "pull: no image URI"))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	var mu sync.Mutex // guards enc and w between progress callbacks and the end
	send := func(ev PullEvent) {
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(ev); err == nil {
			_ = rc.Flush()
		}
	}
	img, err := s.images.Pull(r.Context(), req.URI, image.PullOptions{
		Insecure: req.Insecure,
		Progress: func(p image.Progress) { send(PullEvent{Progress: &p}) },
	})
	if err != nil {
		b := errorBody(err) // it names the URI
		send(PullEvent{Error: &b.Error})
		return
	}
	send(PullEvent{Image: img})
}

func (s *Server) handleListImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.images.List(r.Context())
	if err != nil {
		s.writeError(w, r, fmt.Errorf("list images: %w", err))
		return
	}
	if imgs == nil {
		imgs = []*image.Image{}
	}
	s.writeJSON(w, http.StatusOK, imgs)
}

func (s *Server) handleGetImage(w http.ResponseWriter, r *http.Request) {
	img, err := s.images.Get(r.Context(), r.PathValue("ref"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, img)
}

func (s *Server) handleRemoveImage(w http.ResponseWriter, r *http.Request) {
	if err := s.images.Remove(r.Context(), r.PathValue("ref")); err != nil {
		s.writeError(w, r, fmt.Errorf("remove image: %w", err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
