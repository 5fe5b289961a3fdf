package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"kurma.dev/kurma/pkg/controllerapi"
)

// externalNetworkCmd is `kurma-controller external-network create|list|delete`:
// the operator's way to manage the external networks floating IPs come
// from (LoadBalancer Services: the watcher's --external-network), through
// a running controller's API.
func externalNetworkCmd(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kurma-controller external-network", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("controller", "http://127.0.0.1:9696", "controller base URL")
	tokenFile := fs.String("token-file", "", "file holding the controller's bearer token")
	cidr := fs.String("cidr", "", "create: the network's prefix, e.g. 198.51.100.0/24")
	gateway := fs.String("gateway", "", "create: gateway address (default: first host address)")
	pool := fs.String("pool", "", "create: the addresses handed out, START-END (default: the whole prefix but the gateway)")
	usage := errors.New("usage: kurma-controller external-network create ID --cidr PREFIX [--gateway IP] [--pool START-END] | list | delete ID  [--controller URL] [--token-file FILE]")
	if len(args) == 0 {
		return usage
	}
	verb := args[0]
	var id string
	rest := args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		id, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return fmt.Errorf("%w\n%v", err, usage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected %q\n%v", fs.Args(), usage)
	}
	var opts []controllerapi.Option
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, controllerapi.WithToken(strings.TrimSpace(string(b))))
	}
	c, err := controllerapi.New(*url, opts...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	switch verb {
	case "create":
		if id == "" || *cidr == "" {
			return usage
		}
		n := controllerapi.ExternalNetwork{ID: id, Name: id, CIDR: *cidr, GatewayIP: *gateway}
		if *pool != "" {
			start, end, ok := strings.Cut(*pool, "-")
			if !ok || start == "" || end == "" {
				return fmt.Errorf("--pool %q: want START-END", *pool)
			}
			n.AllocationPools = []controllerapi.AllocationPool{{Start: start, End: end}}
		}
		got, err := c.CreateExternalNetwork(ctx, n)
		if err != nil {
			return err
		}
		return enc.Encode(got)
	case "list":
		if id != "" {
			return usage
		}
		l, err := c.ListExternalNetworks(ctx)
		if err != nil {
			return err
		}
		return enc.Encode(l)
	case "delete":
		if id == "" {
			return usage
		}
		return c.DeleteExternalNetwork(ctx, id)
	}
	return usage
}
