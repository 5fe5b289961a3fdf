// Command kurma-controller is Kurma's network controller: the REST API of
// docs/controller-api.md (spec 003's port agreement plus projects, VPCs,
// subnets, hosts, long polls and watches) over a bbolt file or etcd.
//
//	kurma-controller --listen 127.0.0.1:9696 --store bolt:/var/lib/kurma-controller/controller.db
//	kurma-controller --listen 0.0.0.0:9696 --token-file /etc/kurma/token --store etcd:http://10.0.0.5:2379
//
// Without a token it only listens on loopback. SIGTERM or SIGINT shut it
// down gracefully: it stops accepting, ends watches and long polls, waits
// for in-flight requests, then closes the store.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"kurma.dev/kurma/internal/controller/api"
	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
	"kurma.dev/kurma/internal/controller/store/etcdstore"
)

type options struct {
	listen, storeSpec, token, tokenFile, cert, key, logLevel string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "external-network" {
		if err := externalNetworkCmd(context.Background(), os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "kurma-controller:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	fs := flag.NewFlagSet("kurma-controller", flag.ExitOnError)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9696", "address to serve the API on")
	fs.StringVar(&o.storeSpec, "store", "bolt:/var/lib/kurma-controller/controller.db", "bolt:PATH or etcd:URL[,URL...]")
	fs.StringVar(&o.token, "token", "", "bearer token clients must send (prefer --token-file)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token")
	fs.StringVar(&o.cert, "tls-cert", "", "TLS certificate (PEM); with --tls-key serves HTTPS")
	fs.StringVar(&o.key, "tls-key", "", "TLS private key (PEM)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	_ = fs.Parse(os.Args[1:])

	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "kurma-controller: --log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("controller failed", "err", err)
		os.Exit(1)
	}
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func openStore(ctx context.Context, spec string, log *slog.Logger) (store.Store, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, fmt.Errorf("--store %q: want bolt:PATH or etcd:ENDPOINTS", spec)
	}
	switch kind {
	case "bolt":
		return boltstore.Open(arg, boltstore.Options{Logger: log})
	case "etcd":
		return etcdstore.Open(ctx, etcdstore.Options{Endpoints: strings.Split(arg, ",")})
	}
	return nil, fmt.Errorf("--store %q: unknown backend %q", spec, kind)
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	token := o.token
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return fmt.Errorf("token file %s is empty", o.tokenFile)
		}
	}
	if token == "" && !isLoopback(o.listen) {
		return fmt.Errorf("refusing to listen on %s without a token: use a loopback address or --token-file", o.listen)
	}
	if (o.cert == "") != (o.key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	st, err := openStore(ctx, o.storeSpec, log)
	if err != nil {
		return err
	}
	defer st.Close()
	srv, err := api.New(api.Config{Store: st, Token: token, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Requests (watches, long polls) end when baseCtx is cancelled.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(cancelBase)
	feedCtx, cancelFeed := context.WithCancel(context.Background())
	defer cancelFeed()
	go srv.Run(feedCtx)

	errc := make(chan error, 1)
	go func() {
		if o.cert != "" {
			errc <- hs.ServeTLS(ln, o.cert, o.key)
		} else {
			errc <- hs.Serve(ln)
		}
	}()
	log.Info("controller listening", "addr", ln.Addr().String(), "store", strings.SplitN(o.storeSpec, ":", 2)[0], "tls", o.cert != "", "auth", token != "")
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("shutdown incomplete", "err", err)
	}
	cancelFeed()
	return nil
}
