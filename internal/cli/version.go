package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"kurma.dev/kurma/internal/api/wire"
)

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and the daemon's versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			client := wire.VersionInfo{Version: Version, APIVersion: wire.Version, GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
			c := e.client()
			defer c.Close()
			server, err := c.Version(cmd.Context())
			if e.json {
				out := map[string]any{"client": client}
				if err == nil {
					out["server"] = server
				}
				if perr := printJSON(e.stdout, out); perr != nil {
					return perr
				}
				return err
			}
			fmt.Fprintf(e.stdout, "Client:\n  Version:     %s\n  API version: %s\n  Go version:  %s\n  OS/Arch:     %s/%s\n",
				client.Version, client.APIVersion, client.GoVersion, client.OS, client.Arch)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "Server:\n  Version:     %s\n  API version: %s\n  Go version:  %s\n  OS/Arch:     %s/%s\n",
				server.Version, server.APIVersion, server.GoVersion, server.OS, server.Arch)
			return nil
		},
	}
}
