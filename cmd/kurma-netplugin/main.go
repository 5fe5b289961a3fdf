// Command kurma-netplugin is the default network plugin image's only
// binary. Installed as /opt/network/add and /opt/network/del it attaches and
// detaches pods (config on stdin; arguments NETNS_PATH POD_UUID IFNAME);
// run under any other name it is the image's main executable, which
// validates the config from stdin and stays up until SIGTERM. The logic is
// in internal/network/netplugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"kurma.dev/kurma/internal/network/netplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := netplugin.Main(ctx, netplugin.IO{
		Args: os.Args, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
	})
	stop()
	os.Exit(code)
}
