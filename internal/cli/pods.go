package cli

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kurma.dev/kurma/internal/pod/podtypes"
)

func newPsCmd(e *env) *cobra.Command {
	var all, quiet bool
	cmd := &cobra.Command{
		Use:     "ps",
		Aliases: []string{"list", "ls"},
		Short:   "List pods (running ones unless -a)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			pods, err := c.ListPods(cmd.Context())
			if err != nil {
				return err
			}
			sel := []*podtypes.Pod{}
			for _, p := range pods {
				if all || p.State == podtypes.Running || p.State == podtypes.Creating || p.State == podtypes.Stopping {
					sel = append(sel, p)
				}
			}
			sort.Slice(sel, func(i, j int) bool { return sel[i].Created.Before(sel[j].Created) })
			if e.json {
				return printJSON(e.stdout, sel)
			}
			if quiet {
				for _, p := range sel {
					fmt.Fprintln(e.stdout, p.UUID)
				}
				return nil
			}
			t := newTable(e.stdout, "POD ID", "NAME", "STATE", "APPS", "IMAGES", "CREATED")
			now := time.Now()
			for _, p := range sel {
				var apps, imgs []string
				for _, a := range p.Apps {
					apps = append(apps, a.Name)
					imgs = append(imgs, a.Image)
				}
				t.row(shortUUID(p.UUID), p.Name, string(p.State), strings.Join(apps, ","), strings.Join(imgs, ","), ago(p.Created, now))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "show every pod, exited ones too")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only UUIDs")
	return cmd
}

func newInspectCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "inspect POD...",
		Short:             "Show pods' records as JSON",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			// Like podman: what was found is printed, the rest fails.
			out := []*podtypes.Pod{}
			var errs []error
			for _, ref := range args {
				p, err := c.GetPod(cmd.Context(), ref)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				out = append(out, p)
			}
			if len(out) > 0 {
				if err := printJSON(e.stdout, out); err != nil {
					return err
				}
			}
			return errors.Join(errs...)
		},
	}
}

func newStatusCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:               "status POD",
		Short:             "Show the state of a pod's apps (the stager's status call-in)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			st, err := c.PodStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if e.json {
				return printJSON(e.stdout, st)
			}
			names := make([]string, 0, len(st))
			for n := range st {
				names = append(names, n)
			}
			sort.Strings(names)
			t := newTable(e.stdout, "APP", "STATE", "PID", "EXIT CODE", "REASON")
			for _, n := range names {
				a := st[n]
				state, pid, code := "running", strconv.Itoa(a.PID), "-"
				if a.Exited {
					state, pid = "exited", "-"
					if a.ExitCode != nil {
						code = strconv.Itoa(*a.ExitCode)
					}
				}
				t.row(n, state, pid, code, a.ExitReason)
			}
			return t.flush()
		},
	}
}

func newLogsCmd(e *env) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:               "logs [-f] POD [APP]",
		Short:             "Print an app's log (APP may be left out when the pod has one app)",
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			app := ""
			if len(args) == 2 {
				app = args[1]
			}
			c := e.client()
			defer c.Close()
			err := c.Logs(cmd.Context(), args[0], app, follow, e.stdout)
			if err != nil && cmd.Context().Err() != nil {
				return nil // an interrupted follow is a normal end
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming until the app exits")
	return cmd
}

func newStopCmd(e *env) *cobra.Command {
	var grace int
	cmd := &cobra.Command{
		Use:               "stop [-t SECS] POD...",
		Short:             "Stop pods (SIGTERM, then SIGKILL after the grace period)",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			return e.eachRef(args, func(ref string) error { return c.StopPod(cmd.Context(), ref, grace) })
		},
	}
	cmd.Flags().IntVarP(&grace, "time", "t", 10, "seconds to wait before SIGKILL")
	return cmd
}

func newRmCmd(e *env) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:               "rm [-f] POD...",
		Short:             "Remove stopped pods (running ones too with -f)",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completePods(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			return e.eachRef(args, func(ref string) error { return c.RemovePod(cmd.Context(), ref, force) })
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop running pods first")
	return cmd
}
