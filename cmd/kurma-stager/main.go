// Command kurma-stager is Kurma's default stager. One static binary plays
// every role, chosen by the basename it was called by or its first
// argument: the stager itself (installed as /stager), "init" (the pod's
// PID 1), and the call-ins status, logs, run and attach (installed as
// /opt/stager/<name>).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"kurma.dev/kurma/internal/stager"
	"kurma.dev/kurma/pkg/stagerspec"
)

var roles = []string{"init", "status", "logs", "run", "attach"}

func main() {
	role := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if !slices.Contains(roles, role) {
		role = "stager"
		if len(args) > 0 && slices.Contains(roles, args[0]) {
			role, args = args[0], args[1:]
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("role", role)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, stop, log, role, args))
}

func run(ctx context.Context, stop func(), log *slog.Logger, role string, args []string) int {
	fail := func(code int, err error) int {
		fmt.Fprintf(os.Stderr, "kurma-stager %s: %v\n", role, err)
		// A command that could not be executed: 126 or 127, as shells.
		var ee *stager.ExecError
		if errors.As(err, &ee) {
			return ee.Code
		}
		return code
	}
	switch role {
	case "stager":
		if err := stager.RunStager(ctx, log); err != nil {
			return fail(1, err)
		}
	case "init":
		if err := stager.RunInit(context.Background(), log); err != nil {
			return fail(1, err)
		}
	case "status":
		if err := stager.Status(ctx, os.Stdout); err != nil {
			return fail(1, err)
		}
	case "logs":
		app, follow := "", false
		for _, a := range args {
			switch a {
			case "-f", "--follow":
				follow = true
			default:
				app = a
			}
		}
		if app == "" {
			return fail(2, fmt.Errorf("usage: logs APP [-f]"))
		}
		if err := stager.Logs(ctx, app, follow, os.Stdout); err != nil {
			return fail(1, err)
		}
	case "run":
		// Failures of run itself exit 125 so they are not mistaken for the
		// command's own exit code.
		if len(args) != 1 {
			return fail(125, fmt.Errorf("usage: run APP (settings on fd %d)", stagerspec.RunSettingsFD))
		}
		timeout := stager.SettingsTimeout
		if v := os.Getenv(stager.SettingsTimeoutEnv); v != "" {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				timeout = d
			}
		}
		f, err := stager.SettingsFile(stagerspec.RunSettingsFD)
		if err != nil {
			return fail(125, err)
		}
		s, err := stager.ReadSettings(f, timeout)
		f.Close()
		if err != nil {
			return fail(125, err)
		}
		stop() // signals now belong to the command; run ends when it does
		code, err := stager.Run(context.Background(), args[0], s, os.Stdin, os.Stdout, os.Stderr)
		if err != nil {
			return fail(125, err)
		}
		return code
	case "attach":
		closeStdin := len(args) == 2 && args[1] == stager.CloseStdinFlag
		if len(args) != 1 && !closeStdin {
			return fail(2, fmt.Errorf("usage: attach APP [%s]", stager.CloseStdinFlag))
		}
		if err := stager.Attach(ctx, args[0], closeStdin, os.Stdin, os.Stdout, os.Stderr); err != nil {
			return fail(1, err)
		}
	}
	return 0
}
