package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain builds the binary once when `make build` has not provided one
// (KURMA_BIN_DIR unset), instead of once per test.
func TestMain(m *testing.M) {
	if os.Getenv("KURMA_BIN_DIR") == "" {
		dir, err := os.MkdirTemp("", "kctl-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "kurma-controller"), ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build kurma-controller: %v\n%s", err, out)
			os.Exit(1)
		}
		os.Setenv("KURMA_BIN_DIR", dir)
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}
