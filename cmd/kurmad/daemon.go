package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kurma.dev/kurma/internal/api"
	"kurma.dev/kurma/internal/config"
	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// version is kurmad's version, reported by the API and in stager manifests.
const version = "0.1.0"

type flags struct {
	config, socket, logLevel string
	metricsListen            string
	stopPods, showVersion    bool
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	var f flags
	fs := flag.NewFlagSet("kurmad", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "configuration file (YAML or JSON); defaults when empty")
	fs.StringVar(&f.socket, "socket", "", "API socket path (overrides the configuration)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.stopPods, "stop-pods-on-exit", false, "stop every pod when shutting down")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", "TCP address serving Prometheus /metrics and /healthz (the API socket serves them too); empty: none")
	fs.BoolVar(&f.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return &f, nil
}

func run(args []string) int {
	f, err := parseFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if f.showVersion {
		fmt.Println("kurmad", version)
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "kurmad: --log-level %q: %v\n", f.logLevel, err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := serve(ctx, f, log); err != nil {
		log.Error("kurmad failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the daemon until ctx ends.
func serve(ctx context.Context, f *flags, log *slog.Logger) error {
	cfg, err := config.Load(f.config)
	if err != nil {
		return err
	}
	if f.socket != "" {
		cfg.Socket = f.socket
	}
	gid, err := lookupGroup(cfg.SocketGroup)
	if err != nil {
		return err
	}
	keys, err := loadKeys(cfg.TrustedKeys, log)
	if err != nil {
		return err
	}
	store, err := image.Open(ctx, cfg.ImagesDir, image.Options{Keyring: keys, Logger: log.With("component", "image")})
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	defer store.Close()
	// Pod networking (network.go): nil when off.
	nets, err := newNetSetup(cfg, log.With("component", "network"))
	if err != nil {
		return fmt.Errorf("pod networks: %w", err)
	}
	metrics := newDaemonMetrics()
	mgr, err := pod.New(ctx, pod.Options{
		PodsDir:      cfg.PodsDir,
		VolumesDir:   cfg.VolumesDir,
		Images:       store,
		StagerImage:  cfg.StagerImage,
		StagerConfig: cfg.StagerConfig,
		ReadyTimeout: time.Duration(cfg.ReadyTimeout),
		NoPrestart:   cfg.PrestartStager != nil && !*cfg.PrestartStager,
		KurmaVersion: version,
		Logger:       log.With("component", "pod"),
		Network:      nets.networker(),
		ObserveStep:  metrics.observeStep,
	})
	if err != nil {
		return fmt.Errorf("open pod manager: %w", err)
	}
	metrics.watchPods(mgr)
	srv, err := api.NewServer(api.Options{Pods: mgr, Images: store, Version: version, Logger: log.With("component", "api"),
		Networks: nets, Metrics: metrics.reg})
	if err != nil {
		return err
	}
	if err := metrics.serveTCP(ctx, f.metricsListen, log); err != nil {
		_ = mgr.Close(context.Background())
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	l, err := api.Listen(cfg.Socket, gid)
	if err != nil {
		_ = mgr.Close(context.Background())
		return err
	}
	log.Info("kurmad listening", "socket", cfg.Socket, "version", version, "config", f.config)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := nets.start(ctx, store, mgr); err != nil {
			log.Error("start pod networking", "err", err)
		}
		startup(ctx, cfg, store, mgr, log)
	}()
	serveErr := srv.Serve(ctx, l)
	wg.Wait()
	log.Info("kurmad shutting down", "stopPods", f.stopPods)
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if f.stopPods {
		// Every pod first, the networking pod last (their dels need it).
		stopAll(sctx, mgr, log, nets.netPodName())
		nets.stop(sctx)
	} else if onlyPodRunning(sctx, mgr, nets.netPodName()) {
		// Nothing needs the networking pod until the next start.
		nets.stop(sctx)
	}
	if err := mgr.Close(sctx); err != nil {
		log.Warn("close pod manager", "err", err)
	}
	return serveErr
}

// startup prefetches the configured images and creates the initial pods
// that do not exist yet. Failures are logged: the daemon keeps serving.
func startup(ctx context.Context, cfg *config.Config, store image.Store, mgr pod.Manager, log *slog.Logger) {
	var wg sync.WaitGroup
	for _, uri := range cfg.PrefetchImages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if img, err := store.Pull(ctx, uri, image.PullOptions{}); err != nil {
				log.Error("prefetch image", "uri", uri, "err", err)
			} else {
				log.Info("prefetched image", "uri", uri, "id", img.ID)
			}
		}()
	}
	wg.Wait()
	for _, spec := range cfg.InitialPods {
		if ctx.Err() != nil {
			return
		}
		if _, err := mgr.Get(ctx, spec.Name); err == nil {
			log.Info("initial pod exists", "pod", spec.Name)
			continue
		} else if !errors.Is(err, kerrors.NotFound) {
			log.Error("look up initial pod", "pod", spec.Name, "err", err)
			continue
		}
		if p, err := mgr.Create(ctx, spec); err != nil {
			log.Error("start initial pod", "pod", spec.Name, "err", err)
		} else {
			log.Info("started initial pod", "pod", p.Name, "uuid", p.UUID)
		}
	}
}

// stopAll stops every running pod but the one named except, concurrently.
func stopAll(ctx context.Context, mgr pod.Manager, log *slog.Logger, except string) {
	pods, err := mgr.List(ctx)
	if err != nil {
		log.Error("list pods", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		if p.State != pod.Running && p.State != pod.Creating || p.Name == except && except != "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := mgr.Stop(ctx, p.UUID, api.DefaultGrace); err != nil {
				log.Error("stop pod", "pod", p.Name, "err", err)
			}
		}()
	}
	wg.Wait()
}

// onlyPodRunning reports whether name is the only pod running (or being
// created); false when name is "".
func onlyPodRunning(ctx context.Context, mgr pod.Manager, name string) bool {
	if name == "" {
		return false
	}
	pods, err := mgr.List(ctx)
	if err != nil {
		return false
	}
	for _, p := range pods {
		if (p.State == pod.Running || p.State == pod.Creating) && p.Name != name {
			return false
		}
	}
	return true
}

// lookupGroup resolves the socket group (name or number); "" is root's.
func lookupGroup(g string) (int, error) {
	if g == "" {
		return 0, nil
	}
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("socketGroup %q: %w", g, err)
	}
	n, err := strconv.Atoi(grp.Gid)
	if err != nil {
		return 0, fmt.Errorf("socketGroup %q: gid %q: %w", g, grp.Gid, err)
	}
	return n, nil
}

// loadKeys builds the trusted keyring. A key file that does not exist is
// skipped with a warning (stager pulls then fail as untrusted); a malformed
// one is an error.
func loadKeys(entries []string, log *slog.Logger) (*trust.Keyring, error) {
	var ok []string
	for _, e := range entries {
		if strings.HasPrefix(e, "/") {
			if _, err := os.Stat(e); errors.Is(err, fs.ErrNotExist) {
				log.Warn("trusted key file missing; skipped", "path", e)
				continue
			}
		}
		ok = append(ok, e)
	}
	kr, err := trust.LoadKeyring(ok...)
	if err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	return kr, nil
}
