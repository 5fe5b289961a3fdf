package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/pkg/kerrors"
)

func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(args, &out); err != nil {
		t.Fatalf("kurma-acbuild %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(out.String())
}

func TestBuildSignPull(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	os.Symlink("tool", filepath.Join(src, "bin", "alias"))
	os.WriteFile(filepath.Join(dir, "conf"), []byte("c"), 0o600)

	prefix := filepath.Join(dir, "keys", "stager")
	os.MkdirAll(filepath.Dir(prefix), 0o755)
	runOK(t, "keygen", "-o", prefix)
	if fi, err := os.Stat(prefix + ".key"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key: %v %v", fi, err)
	}
	if err := run([]string{"keygen", "-o", prefix}, &bytes.Buffer{}); err == nil {
		t.Error("keygen overwrote an existing key")
	}
	aci := filepath.Join(dir, "app.aci")
	args := []string{"build", "-o", aci, "--name", "kurma.dev/app", "--exec", "/bin/tool -v", "--label", "version=1",
		"--env", "A=1", "--user", "10", "--group", "20", "--port", "http:tcp:8080", "--annotation", "k=v",
		"--add", src + ":/", "--add", filepath.Join(dir, "conf") + ":/etc/conf"}
	id := runOK(t, args...)
	if id2 := runOK(t, args...); id2 != id {
		t.Errorf("build not deterministic: %s vs %s", id, id2)
	}
	gz := filepath.Join(dir, "app-gz.aci")
	if idz := runOK(t, append(args[:0:0], append([]string{"build", "-o", gz, "--gzip"}, args[3:]...)...)...); idz != id {
		t.Errorf("gzip ACI ID %s differs from plain %s", idz, id)
	}
	if got := runOK(t, "id", aci); got != id {
		t.Errorf("id = %s, want %s", got, id)
	}
	runOK(t, "sign", "--key", prefix+".key", aci)
	layoutDir := filepath.Join(dir, "layout")
	runOK(t, "oci-layout", "-o", layoutDir, "--from-aci", aci, "--tag", "kurma.dev/app:1")
	tarPath := filepath.Join(dir, "app.tar")
	runOK(t, "oci-layout", "-o", tarPath, "--from-aci", gz, "--tarball")
	addLayout := filepath.Join(dir, "layout2")
	runOK(t, "oci-layout", "-o", addLayout, "--name", "kurma.dev/direct", "--exec", "/bin/tool", "--add", src+":/")

	ring, err := trust.LoadKeyring(prefix + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(t.Context(), filepath.Join(dir, "store"), image.Options{Keyring: ring})
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(t.Context(), "file://"+aci, image.PullOptions{RequireSignature: true})
	if err != nil {
		t.Fatal(err)
	}
	m := img.Manifest
	if img.ID != id || m.App == nil || strings.Join(m.App.Exec, " ") != "/bin/tool -v" || m.App.User != "10" || m.App.Group != "20" ||
		len(m.App.Ports) != 1 || len(m.Annotations) != 1 {
		t.Errorf("pulled %+v app %+v", img, m.App)
	}
	ls, err := s.Resolve(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(ls[0].Path, "bin/alias")); err != nil || target != "tool" {
		t.Errorf("symlink = %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(ls[0].Path, "bin/tool")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("tool: %v %v", fi, err)
	}
	if _, err := s.Pull(t.Context(), "file://"+gz, image.PullOptions{RequireSignature: true}); !errors.Is(err, kerrors.Unauthorized) {
		t.Errorf("unsigned gzip ACI: %v", err)
	}
	for _, uri := range []string{"file://" + layoutDir, "file://" + tarPath, "file://" + addLayout} {
		img, err := s.Pull(t.Context(), uri, image.PullOptions{})
		if err != nil {
			t.Fatalf("pull %s: %v", uri, err)
		}
		ls, err := s.Resolve(t.Context(), img.ID)
		if err != nil || len(ls) != 1 {
			t.Fatalf("resolve %s: %v %v", uri, ls, err)
		}
		if _, err := os.Stat(filepath.Join(ls[0].Path, "bin/tool")); err != nil {
			t.Errorf("%s: %v", uri, err)
		}
		if img.Manifest.App == nil || img.Manifest.App.Exec[0] != "/bin/tool" {
			t.Errorf("%s: app %+v", uri, img.Manifest.App)
		}
	}
}

func TestBadArgs(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"keygen"},
		{"build", "--name", "x"},
		{"build", "-o", filepath.Join(dir, "x.aci")},
		{"build", "-o", filepath.Join(dir, "x.aci"), "--name", "x", "--add", "nocolon"},
		{"build", "-o", filepath.Join(dir, "x.aci"), "--name", "x", "--add", "/nonexistent:/x"},
		{"build", "-o", filepath.Join(dir, "x.aci"), "--name", "x", "--env", "1BAD=x"},
		{"sign", filepath.Join(dir, "x.aci")},
		{"oci-layout", "--from-aci", "x"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("failed builds left files: %v", left)
	}
}
