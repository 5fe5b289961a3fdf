package cli

import (
	"github.com/spf13/cobra"

	apiclient "kurma.dev/kurma/internal/api/client"
	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/internal/pod/podtypes"
)

func newExecCmd(e *env) *cobra.Command {
	var app, user, workdir string
	var envs []string
	var tty, interactive bool
	cmd := &cobra.Command{
		Use:   "exec [flags] POD [APP] COMMAND [ARG...]",
		Short: "Run a command in an app of a running pod",
		Long: `Run a command in an app of a running pod and exit with its exit code.
APP may be left out when the pod has one app. Without --app, the argument
after POD is taken as the app when it names one of the pod's apps and a
command follows it; with --app it is always the command.`,
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c := e.client()
			defer c.Close()
			ref, rest := args[0], args[1:]
			if app == "" && len(rest) > 1 {
				p, err := c.GetPod(ctx, ref)
				if err != nil {
					return err
				}
				if pickApp(p, rest[0]) {
					app, rest = rest[0], rest[1:]
				}
			}
			envv, err := ParseEnv(envs)
			if err != nil {
				return err
			}
			req := wire.ExecRequest{App: app, Exec: rest, Env: envv, WorkingDirectory: workdir, TTY: tty}
			req.User, req.Group = ParseUser(user)
			sio := apiclient.StreamIO{Stdout: e.stdout, Stderr: e.stderr}
			if interactive {
				sio.Stdin = e.stdin
			}
			if tty {
				ts := startTTY(ctx, sio.Stdin, e.stdout)
				defer ts.restore()
				sio.Resize = ts.resize
				req.Rows, req.Cols = ts.rows, ts.cols
			}
			code, err := c.Exec(ctx, ref, req, sio)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.SetInterspersed(false)
	fl.StringVar(&app, "app", "", "the app to run in (default: the pod's only app)")
	fl.StringArrayVarP(&envs, "env", "e", nil, "set an environment variable NAME=value")
	fl.StringVarP(&user, "user", "u", "", "run as USER[:GROUP] (default: the app's)")
	fl.StringVarP(&workdir, "workdir", "w", "", "working directory (default: the app's)")
	fl.BoolVarP(&tty, "tty", "t", false, "allocate a terminal")
	fl.BoolVarP(&interactive, "interactive", "i", false, "connect stdin")
	return cmd
}

// pickApp reports whether arg names an app of p, so that it is the APP
// argument of exec rather than the command.
func pickApp(p *podtypes.Pod, arg string) bool {
	for _, a := range p.Apps {
		if a.Name == arg {
			return true
		}
	}
	return false
}

func newAttachCmd(e *env) *cobra.Command {
	var noStdin bool
	cmd := &cobra.Command{
		Use:               "attach [--no-stdin] POD [APP]",
		Short:             "Connect to an app's stdin, stdout and stderr",
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c := e.client()
			defer c.Close()
			p, err := c.GetPod(ctx, args[0])
			if err != nil {
				return err
			}
			req := wire.AttachRequest{}
			if len(args) == 2 {
				req.App = args[1]
			}
			for i, a := range p.Apps {
				if (req.App == "" || a.Name == req.App) && i < len(p.Spec.Apps) && p.Spec.Apps[i].TTY {
					req.TTY = true
				}
			}
			sio := apiclient.StreamIO{Stdout: e.stdout, Stderr: e.stderr}
			if !noStdin {
				sio.Stdin = e.stdin
			}
			if req.TTY {
				ts := startTTY(ctx, sio.Stdin, e.stdout)
				defer ts.restore()
				sio.Resize = ts.resize
				req.Rows, req.Cols = ts.rows, ts.cols
			}
			code, err := c.Attach(ctx, p.UUID, req, sio)
			if err != nil {
				if ctx.Err() != nil {
					return nil // interrupted: detached
				}
				return err
			}
			if code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&noStdin, "no-stdin", false, "do not connect stdin")
	return cmd
}
