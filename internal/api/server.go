package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	image "kurma.dev/kurma/internal/image/imagetypes"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// Options configure a Server.
type Options struct {
	Pods   pod.Manager
	Images image.Store
	// Version is the daemon's version string, reported by GET /v1/version.
	Version string
	Logger  *slog.Logger
	// StatusPoll is the first interval between status call-ins while a
	// run waits for its app's exit code (doubling up to 100 ms); default 2 ms.
	StatusPoll time.Duration
	// Networks lists the daemon's pod networks for GET /v1/networks
	// (server_networks.go); nil: the list is empty.
	Networks NetworkLister
	// Metrics, when set, gets the API's request metrics (metrics.go), and
	// GET /metrics serves everything registered in it. GET /healthz
	// answers "ok" either way.
	Metrics *prometheus.Registry
}

// Server serves the kurmad API.
type Server struct {
	pods       pod.Manager
	images     image.Store
	version    string
	log        *slog.Logger
	statusPoll time.Duration
	mux        *http.ServeMux
	networks   NetworkLister
	metrics    *apiMetrics // nil without Options.Metrics
}

// NewServer returns a server over the given manager and store.
func NewServer(o Options) (*Server, error) {
	if o.Pods == nil || o.Images == nil {
		return nil, errors.New("api: pod manager and image store are required")
	}
	s := &Server{pods: o.Pods, images: o.Images, version: o.Version, log: o.Logger, statusPoll: o.StatusPoll, networks: o.Networks}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.version == "" {
		s.version = "dev"
	}
	if s.statusPoll <= 0 {
		s.statusPoll = 2 * time.Millisecond
	}
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/version", s.handleVersion)
	m.HandleFunc("POST /v1/pods", s.handleCreatePod)
	m.HandleFunc("GET /v1/pods", s.handleListPods)
	m.HandleFunc("GET /v1/pods/{ref}", s.handleGetPod)
	m.HandleFunc("DELETE /v1/pods/{ref}", s.handleRemovePod)
	m.HandleFunc("POST /v1/pods/{ref}/stop", s.handleStopPod)
	m.HandleFunc("GET /v1/pods/{ref}/status", s.handlePodStatus)
	m.HandleFunc("GET /v1/pods/{ref}/logs", s.handleLogs)
	m.HandleFunc("POST /v1/pods/{ref}/exec", s.handleExec)
	m.HandleFunc("POST /v1/pods/{ref}/attach", s.handleAttach)
	m.HandleFunc("POST /v1/images/pull", s.handlePull)
	m.HandleFunc("GET /v1/images", s.handleListImages)
	m.HandleFunc("GET /v1/networks", s.handleListNetworks)
	m.HandleFunc("GET /v1/images/{ref}", s.handleGetImage)
	m.HandleFunc("DELETE /v1/images/{ref}", s.handleRemoveImage)
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if o.Metrics != nil {
		s.metrics = newAPIMetrics(o.Metrics)
		m.Handle("GET /metrics", metricsHandler(o.Metrics))
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, kerrors.New(kerrors.NotFound, "no endpoint %s %s", r.Method, r.URL.Path))
	})
	s.mux = m
	return s, nil
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.metrics != nil {
		s.instrument(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Listen creates the unix socket at path with mode 0660, owned by root and
// group gid (-1 keeps root's group). The socket is made under a temporary
// name and renamed into place, so it is never reachable with looser
// permissions. A stale socket nobody answers on is replaced; a live one is a
// Conflict.
func Listen(path string, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		_ = c.Close()
		return nil, kerrors.New(kerrors.Conflict, "another daemon is listening on %s", path)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	tmp := filepath.Join(filepath.Dir(path), ".kurma-"+hex.EncodeToString(b)+".sock")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = l.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	if err := os.Chmod(tmp, 0o660); err != nil {
		return fail(fmt.Errorf("chmod socket: %w", err))
	}
	if err := os.Lchown(tmp, 0, gid); err != nil {
		return fail(fmt.Errorf("chown socket: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("place socket: %w", err))
	}
	return &unlinkListener{Listener: l, path: path}, nil
}

// unlinkListener removes its socket file when closed.
type unlinkListener struct {
	net.Listener
	path string
}

func (u *unlinkListener) Close() error {
	err := u.Listener.Close()
	_ = os.Remove(u.path)
	return err
}

// Serve answers requests on l until ctx ends, then shuts down: it stops
// accepting, cancels streaming calls (logs -f, exec, attach) and waits up to
// 5 s for the others. It never touches the pods themselves.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve API: %w", err)
	case <-ctx.Done():
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	<-errc
	return nil
}

func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.log.Debug("write response", "err", err)
	}
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := kerrors.HTTPStatus(err)
	lvl := slog.LevelDebug
	if code >= 500 {
		lvl = slog.LevelWarn
	}
	s.log.Log(r.Context(), lvl, "api error", "method", r.Method, "path", r.URL.Path, "status", code, "err", err)
	s.writeJSON(w, code, errorBody(err))
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, VersionInfo{
		Version: s.version, APIVersion: Version, GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH,
	})
}
