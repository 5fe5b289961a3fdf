package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	apiclient "kurma.dev/kurma/internal/api/client"
	"kurma.dev/kurma/internal/api/wire"
)

// Exit codes of kurma (besides a command's own code from run and exec),
// those of docker and podman: 125 when kurma or the daemon fails (a name
// not found included), 126 when an app's command cannot be executed, 127
// when it does not exist, 130 when interrupted.
const (
	ExitError       = 125
	ExitCannotExec  = 126
	ExitNotFound    = 127
	ExitInterrupted = 130
)

// Version is the client's version, reported by `kurma version`.
const Version = "0.1.0"

// env holds what every command shares.
type env struct {
	socket string
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

func (e *env) client() *apiclient.Client { return apiclient.New(e.socket) }

// eachRef applies do to every reference named on the command line, printing
// each one that succeeds, as docker and podman do for stop and rm. It goes
// on past failures and returns them all joined.
func (e *env) eachRef(refs []string, do func(ref string) error) error {
	var errs []error
	for _, ref := range refs {
		if err := do(ref); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintln(e.stdout, ref)
	}
	return errors.Join(errs...)
}

// exitError carries a propagated exit code without a message.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Main runs kurma with args (without the program name) and returns the
// process exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	cmd := newRoot(e)
	cmd.SetArgs(args)
	cmd.SetOut(e.stdout)
	cmd.SetErr(e.stderr)
	err := cmd.ExecuteContext(ctx)
	return exitCode(err, e.stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, context.Canceled) {
		return ExitInterrupted // Ctrl-C: the user knows
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	// The daemon's code for an app's command that could not be executed
	// (ExitCannotExec, ExitNotFound).
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) && ec.ExitCode() > 0 {
		return ec.ExitCode()
	}
	return ExitError
}

func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "kurma",
		Short:         "Run and manage pods with kurmad",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	def := os.Getenv("KURMA_SOCKET")
	if def == "" {
		def = wire.DefaultSocket
	}
	root.PersistentFlags().StringVar(&e.socket, "socket", def, "kurmad API socket (env KURMA_SOCKET)")
	root.PersistentFlags().BoolVar(&e.json, "json", false, "print JSON instead of tables")
	root.AddCommand(
		newRunCmd(e), newCreateCmd(e), newPsCmd(e), newInspectCmd(e), newStatusCmd(e), newLogsCmd(e),
		newExecCmd(e), newAttachCmd(e), newStopCmd(e), newRmCmd(e), newImageCmd(e),
		newVersionCmd(e), newNetCmd(e),
	)
	return root
}

// completePods offers pod names for shell completion.
func completePods(e *env) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		c := e.client()
		defer c.Close()
		pods, err := c.ListPods(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}
