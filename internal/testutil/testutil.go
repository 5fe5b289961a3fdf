package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// RequireRoot skips the test unless it runs as root. `make test` always runs
// as root, so these tests always run in CI.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (make test runs as root)")
	}
}

// UniqueName returns prefix followed by random hex, short enough for a Linux
// interface name when prefix is at most 7 bytes (15-byte limit).
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// RepoRoot returns the module root (the folder holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate testutil source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Bin returns the path of a binary built by `make build` (in $KURMA_BIN_DIR,
// default <repo>/bin). When it is missing and name is a package under cmd/ or
// plugins/, it is built into a temporary folder for this test.
func Bin(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	root := RepoRoot(t)
	for _, pkg := range []string{"./cmd/" + name, "./plugins/" + name} {
		if _, err := os.Stat(filepath.Join(root, pkg)); err != nil {
			continue
		}
		out := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
		return out
	}
	t.Fatalf("binary %q not found in %s; run `make build`", name, dir)
	return ""
}

// Run runs a command and fails the test with its output when it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
