package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	apiclient "kurma.dev/kurma/internal/api/client"
	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/kerrors"
)

type runFlags struct {
	name, stager, user, workdir, appName string
	volumes, env, nets                   []string
	rm, detach, tty, interactive         bool
}

func newRunCmd(e *env) *cobra.Command {
	var f runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] IMAGE [COMMAND [ARG...]]",
		Short: "Create and start a pod running IMAGE",
		Long: `Create and start a pod with one app from IMAGE (docker://, file://,
http(s)://, a stored reference or an image ID). Without -d, kurma streams the
app's output and exits with its exit code.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runPod(cmd, e, &f, args) },
	}
	fl := cmd.Flags()
	fl.SetInterspersed(false)
	fl.StringVar(&f.name, "name", "", "pod name (default: derived from the image)")
	fl.StringArrayVarP(&f.volumes, "volume", "v", nil, "mount a volume: HOST-PATH:/path[:ro] or NAME:/path[:ro]")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set an environment variable NAME=value (NAME alone copies it)")
	fl.StringArrayVar(&f.nets, "net", nil, "networks to attach (names from pod_networks; host; none)")
	fl.BoolVar(&f.rm, "rm", false, "remove the pod once its app exits")
	fl.BoolVarP(&f.detach, "detach", "d", false, "print the pod's UUID and return at once")
	fl.BoolVarP(&f.tty, "tty", "t", false, "give the app a terminal")
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "connect stdin to the app")
	fl.StringVar(&f.stager, "stager", "", "stager image (default: the daemon's)")
	fl.StringVarP(&f.user, "user", "u", "", "run the app as USER[:GROUP]")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory of the app")
	fl.StringVar(&f.appName, "app-name", "", "name of the app (default: derived from the image)")
	return cmd
}

func buildSpec(f *runFlags, args []string) (podtypes.Spec, error) {
	app := podtypes.AppSpec{Name: f.appName, Image: args[0], Exec: args[1:], TTY: f.tty, WorkingDirectory: f.workdir}
	app.User, app.Group = ParseUser(f.user)
	var err error
	if app.Env, err = ParseEnv(f.env); err != nil {
		return podtypes.Spec{}, err
	}
	spec := podtypes.Spec{Name: f.name, StagerImage: f.stager}
	for i, v := range f.volumes {
		vol, m, err := ParseVolume(v, i)
		if err != nil {
			return podtypes.Spec{}, err
		}
		dup := false
		for _, ov := range spec.Volumes {
			dup = dup || ov.Name == vol.Name
		}
		if !dup {
			spec.Volumes = append(spec.Volumes, vol)
		}
		app.Mounts = append(app.Mounts, m)
	}
	if spec.Networks, err = parseNets(f.nets); err != nil {
		return podtypes.Spec{}, err
	}
	spec.Apps = []podtypes.AppSpec{app}
	if err := wire.ValidateSpec(&spec); err != nil {
		return podtypes.Spec{}, err
	}
	return spec, nil
}

func runPod(cmd *cobra.Command, e *env, f *runFlags, args []string) error {
	spec, err := buildSpec(f, args)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	c := e.client()
	defer c.Close()
	if f.detach {
		if f.rm {
			return kerrors.New(kerrors.Invalid, "--rm and -d cannot be combined")
		}
		p, err := c.CreatePod(ctx, spec)
		if err != nil {
			return err
		}
		if e.json {
			return printJSON(e.stdout, p)
		}
		fmt.Fprintln(e.stdout, p.UUID)
		return nil
	}
	sio := apiclient.StreamIO{Stdout: e.stdout, Stderr: e.stderr}
	if f.interactive {
		sio.Stdin = e.stdin
	}
	if f.tty {
		ts := startTTY(ctx, sio.Stdin, e.stdout)
		defer ts.restore()
		sio.Resize = ts.resize
		if ts.rows > 0 && ts.cols > 0 {
			// The app's terminal starts at the caller's size.
			spec.Apps[0].TTYSize = &podtypes.TermSize{Rows: ts.rows, Cols: ts.cols}
		}
	}
	_, code, err := c.RunPod(ctx, wire.CreatePodRequest{Spec: spec, Remove: f.rm}, sio)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}
