package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The floor: what any plugin costs when cnitool drives it on this machine.
// Two plugins that do nothing are measured in the same run as the others:
//
//   - a POSIX shell script, the cheapest process there is here (it prints a
//     minimal result on ADD and nothing on DEL);
//   - a static Go program that does the same, the cheapest a plugin written
//     in Go can be (runtime start, no package inits of note).
//
// cnitool's own start, its config loading, libcni's result cache and the
// plugin's exec are all in these figures; mizarmp minus the Go floor is
// what mizarmp itself (and the controller and agent) add.

const floorScript = `#!/bin/sh
if [ "$CNI_COMMAND" = ADD ]; then printf '{"cniVersion":"1.1.0"}'; fi
exit 0
`

const floorGo = `package main

import "os"

func main() {
	if os.Getenv("CNI_COMMAND") == "ADD" {
		os.Stdout.WriteString(` + "`" + `{"cniVersion":"1.1.0"}` + "`" + `)
	}
}
`

// setupFloors writes the two no-op plugins and their network configs under
// tmp and returns a cnitool driver for each that could be made.
func setupFloors(ctx context.Context, cnitool, tmp string) ([]*tool, []string, error) {
	dir := filepath.Join(tmp, "floor")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "kcninopsh"), []byte(floorScript), 0o755); err != nil {
		return nil, nil, err
	}
	tools := []*tool{}
	names := []string{}
	add := func(name, plugin, label string) error {
		conf := filepath.Join(dir, name)
		if err := os.MkdirAll(conf, 0o755); err != nil {
			return err
		}
		body := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":%q}`, name, plugin)
		if err := os.WriteFile(filepath.Join(conf, name+".conf"), []byte(body), 0o644); err != nil {
			return err
		}
		tools = append(tools, &tool{name: name, cnitool: cnitool, path: filepath.Join(dir, "bin"), confDir: conf})
		names = append(names, label)
		return nil
	}
	if err := add("kcnifloorsh", "kcninopsh", "floor: no-op sh"); err != nil {
		return nil, nil, err
	}
	if err := buildGoFloor(ctx, dir); err != nil {
		fmt.Printf("floor: no Go no-op plugin (%v); only the shell floor is measured\n", err)
		return tools, names, nil
	}
	if err := add("kcnifloorgo", "kcninopgo", "floor: no-op Go"); err != nil {
		return nil, nil, err
	}
	return tools, names, nil
}

// buildGoFloor builds the Go no-op plugin as the Makefile builds mizarmp:
// static and stripped.
func buildGoFloor(ctx context.Context, dir string) error {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module kcninop\n\ngo 1.22\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(floorGo), 0o644); err != nil {
		return err
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = "/usr/local/go/bin/go"
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "bin", "kcninopgo"), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w: %s", err, out)
	}
	return nil
}
