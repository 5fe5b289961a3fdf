package core

import (
	"context"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// Config configures a Core.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
}

// Core owns the controller's rules, its store and its IPAM cache. Create
// with New; start its background work (the port-change feed) with Run.
type Core struct {
	st      store.Store
	log     *slog.Logger
	metrics *metrics
	waiters *waiters
	macs    *ipam.MACGen

	mu       sync.Mutex
	subnets  map[string]*subnetEntry // guarded by mu; key: store key of the subnet or external network
	projects map[string]bool         // guarded by mu; projects known to exist
}

// subnetEntry caches a subnet (or an external network, then vpc is zero)
// and its address tracker.
type subnetEntry struct {
	wire    capi.Subnet
	vpc     capi.VPC
	sub     *ipam.Subnet
	tracker *ipam.Tracker
	key     string // store key of the subnet or external network, and cache key
	ext     bool   // an external network
	ipamPfx string // store prefix of the address bitmap blocks

	loadMu sync.Mutex // serialises (re)loads of the tracker
	loaded bool       // guarded by loadMu
}

// New builds a core over cfg.Store.
func New(cfg Config) (*Core, error) {
	if cfg.Store == nil {
		return nil, kerrors.New(kerrors.Invalid, "no store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Core{
		st:       cfg.Store,
		log:      cfg.Logger,
		metrics:  newMetrics(),
		waiters:  newWaiters(),
		macs:     ipam.NewMACGen(),
		subnets:  map[string]*subnetEntry{},
		projects: map[string]bool{},
	}, nil
}

// Collectors returns the core's metrics (ports by status, create-to-UP
// latency) for the caller's registry.
func (s *Core) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.ports, s.metrics.upLatency}
}

// Run runs background work (the port-change feed behind long polls and
// the ports-by-status gauge) until ctx ends.
func (s *Core) Run(ctx context.Context) { s.feed(ctx) }

// Healthy reports whether the store answers.
func (s *Core) Healthy(ctx context.Context) error {
	_, err := s.st.Rev(ctx)
	return err
}

type metrics struct {
	ports     *prometheus.GaugeVec
	upLatency prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		ports: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kurma_controller_ports",
			Help: "Ports by status, as seen by this replica's change feed.",
		}, []string{"status"}),
		upLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kurma_controller_port_create_to_up_seconds",
			Help:    "Time from port creation to its first UP status.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .5, 1, 5, 30},
		}),
	}
}
