package netplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"kurma.dev/kurma/pkg/kerrors"
)

// Environment variables the executables read (the image sets none: the
// defaults are the image's paths; tests point them elsewhere).
const (
	EnvCNIPath    = "KURMA_CNI_PATH"          // ':'-separated, default /opt/cni/bin
	EnvStateDir   = "KURMA_NETWORK_STATE_DIR" // default /var/lib/kurma-network
	EnvGCInterval = "KURMA_NETPLUGIN_GC_INTERVAL"
)

// CallTimeout bounds add, del and check; the daemon allows a call one
// minute, so we give up a little earlier with a clear error.
const CallTimeout = 55 * time.Second

// DefaultGCInterval is how often the main executable garbage-collects.
const DefaultGCInterval = time.Minute

// IO is the process environment Main runs in.
type IO struct {
	// Args is the full argv, Args[0] included.
	Args   []string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Main runs one invocation of the plugin binary and returns its exit code.
// The command comes from the name it was called by (/opt/network/add,
// /opt/network/del, /opt/network/check), or from the first argument
// ("kurma-netplugin add ..."); anything else runs the main executable,
// which stays up until ctx ends (SIGTERM).
func Main(ctx context.Context, pio IO) int {
	log := slog.New(slog.NewTextHandler(pio.Stderr, nil))
	cmd, args := command(pio.Args)
	opts := Options{StateDir: pio.Getenv(EnvStateDir), Logger: log}
	if p := pio.Getenv(EnvCNIPath); p != "" {
		opts.CNIPath = filepath.SplitList(p)
	}
	switch cmd {
	case "add", "del", "check":
		return runCall(ctx, cmd, args, opts, pio)
	default:
		if err := runMain(ctx, opts, pio); err != nil {
			log.Error("netplugin main exited", "err", err)
			return 1
		}
		return 0
	}
}

func command(argv []string) (string, []string) {
	if len(argv) == 0 {
		return "main", nil
	}
	switch base := filepath.Base(argv[0]); base {
	case "add", "del", "check":
		return base, argv[1:]
	}
	if len(argv) > 1 {
		switch argv[1] {
		case "add", "del", "check", "main":
			return argv[1], argv[2:]
		}
	}
	return "main", argv[1:]
}

func runCall(ctx context.Context, cmd string, args []string, opts Options, pio IO) int {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	ver := "1.0.0"
	fail := func(err error) int {
		e := ToCNIError(err)
		b, _ := json.Marshal(struct {
			CNIVersion string `json:"cniVersion"`
			*types.Error
		}{ver, e})
		fmt.Fprintf(pio.Stdout, "%s\n", b)
		fmt.Fprintf(pio.Stderr, "%s: %v\n", cmd, err)
		return 1
	}
	a, err := ParseArgs(args)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", errBadArgs, err))
	}
	in, err := io.ReadAll(io.LimitReader(pio.Stdin, MaxConfigSize+1))
	if err != nil {
		return fail(fmt.Errorf("read config from stdin: %w", err))
	}
	cfg, err := ParseConfig(in)
	if err != nil {
		return fail(err)
	}
	ver = cfg.List.CNIVersion
	p, err := New(opts)
	if err != nil {
		return fail(err)
	}
	switch cmd {
	case "add":
		res, err := p.Add(ctx, cfg, a)
		if err != nil {
			return fail(err)
		}
		if res == nil {
			return fail(fmt.Errorf("plugin chain returned no result"))
		}
		if err := res.PrintTo(pio.Stdout); err != nil {
			return fail(fmt.Errorf("print result: %w", err))
		}
	case "del":
		if err := p.Del(ctx, cfg, a); err != nil {
			return fail(err)
		}
	case "check":
		if err := p.Check(ctx, cfg, a); err != nil {
			return fail(err)
		}
	}
	return 0
}

var errBadArgs = errors.New("bad arguments")

// ToCNIError maps an error to a CNI error object: errors from plugins keep
// their code; bad arguments are code 4, bad configs 7, timeouts and
// unavailable dependencies 11 (try again later), anything else 999.
func ToCNIError(err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return &types.Error{Code: te.Code, Msg: te.Msg, Details: joinDetails(te.Details, err.Error())}
	}
	code := types.ErrInternal
	switch {
	case errors.Is(err, errBadArgs):
		code = types.ErrInvalidEnvironmentVariables
	case errors.Is(err, kerrors.Invalid):
		code = types.ErrInvalidNetworkConfig
	case errors.Is(err, kerrors.Timeout), errors.Is(err, kerrors.Unavailable), errors.Is(err, context.DeadlineExceeded):
		code = types.ErrTryAgainLater
	}
	return &types.Error{Code: code, Msg: err.Error()}
}

func joinDetails(a, b string) string {
	if a == "" || strings.Contains(b, a) {
		return b
	}
	return a + "; " + b
}

// runMain is the image's main executable: read and validate the config,
// check that its plugins are present, then GC periodically until ctx ends.
func runMain(ctx context.Context, opts Options, pio IO) error {
	dec := json.NewDecoder(io.LimitReader(pio.Stdin, MaxConfigSize+1))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return kerrors.New(kerrors.Invalid, "read config from stdin: %v", err)
	}
	cfg, err := ParseConfig(raw)
	if err != nil {
		return err
	}
	p, err := New(opts)
	if err != nil {
		return err
	}
	if err := p.findPlugins(cfg); err != nil {
		return err
	}
	interval := DefaultGCInterval
	if s := pio.Getenv(EnvGCInterval); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return kerrors.New(kerrors.Invalid, "%s=%q: want a positive duration", EnvGCInterval, s)
		}
		interval = d
	}
	p.log.Info("netplugin ready", "network", cfg.List.Name, "cniVersion", cfg.List.CNIVersion,
		"plugins", cfg.Types(), "cniPath", p.cniPath, "stateDir", p.stateDir, "gcInterval", interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.log.Info("netplugin stopping", "network", cfg.List.Name)
			return nil
		case <-t.C:
			n, err := p.GC(ctx, cfg)
			if err != nil {
				p.log.Warn("gc", "network", cfg.List.Name, "deleted", n, "err", err)
			} else if n > 0 {
				p.log.Info("gc", "network", cfg.List.Name, "deleted", n)
			}
		}
	}
}
