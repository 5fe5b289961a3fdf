package image_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestRemoveAndLeases(t *testing.T) {
	reg := startRegistry(t)
	base := layer(t, map[string]string{"base": "b"})
	push(t, reg+"/a:1", ociImage(t, v1.Config{Cmd: []string{"/a"}}, base, layer(t, map[string]string{"a": "a"})))
	push(t, reg+"/b:1", ociImage(t, v1.Config{Cmd: []string{"/b"}}, base, layer(t, map[string]string{"b": "b"})))
	s, root := newStore(t, image.Options{})
	ctx := t.Context()
	a, err := s.Pull(ctx, "docker://"+reg+"/a:1", image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Pull(ctx, "docker://"+reg+"/b:1", image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	la, _ := s.Resolve(ctx, a.ID)
	baseID := la[1].ID
	entries := func() int { return len(dirEntries(t, filepath.Join(root, "entries"))) }
	if n := entries(); n != 5 {
		t.Fatalf("%d entries, want 5", n)
	}
	if err := s.Lease(ctx, "pod-1", a.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Lease(ctx, "pod-x", "sha512-nothere"); !errors.Is(err, kerrors.NotFound) {
		t.Errorf("lease of unknown image: %v", err)
	}
	if err := s.Remove(ctx, a.ID); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("remove leased: %v, want Conflict", err)
	}
	if err := s.Remove(ctx, baseID); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove of a bare layer: %v, want Conflict", err)
	}
	// Leases survive a restart.
	s.Close()
	s2, err := image.Open(ctx, root, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove(ctx, "docker://"+reg+"/a:1"); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("remove leased after reopen: %v", err)
	}
	if err := s2.Remove(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	// b's own layer is gone, the shared base stays for a.
	if n := entries(); n != 3 {
		t.Errorf("%d entries after removing b, want 3", n)
	}
	if _, err := os.Stat(filepath.Join(root, "entries", baseID)); err != nil {
		t.Errorf("shared layer removed: %v", err)
	}
	if _, err := s2.Get(ctx, b.ID); !errors.Is(err, kerrors.NotFound) {
		t.Errorf("Get removed: %v", err)
	}
	if err := s2.Unlease(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Unlease(ctx, "pod-1"); err != nil {
		t.Errorf("second unlease: %v", err)
	}
	if err := s2.Remove(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 0 {
		t.Errorf("%d entries left, want 0", n)
	}
	if err := s2.Remove(ctx, a.ID); !errors.Is(err, kerrors.NotFound) {
		t.Errorf("remove twice: %v", err)
	}
	list, _ := s2.List(ctx)
	if len(list) != 0 {
		t.Errorf("List = %v", list)
	}
}

func TestOpenCleansLeftovers(t *testing.T) {
	s, root := newStore(t, image.Options{})
	src := t.TempDir()
	p, id := buildACI(t, src, aciSpec{name: "kurma.dev/keep", files: map[string]string{"k": "k"}})
	if _, err := s.Pull(t.Context(), p, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	// A crash mid-pull leaves a work dir and an entry the index never got.
	os.MkdirAll(filepath.Join(root, "tmp", "aci-123", "rootfs", "x"), 0o755)
	orphan := filepath.Join(root, "entries", "sha512-"+fmtHex(64))
	os.MkdirAll(filepath.Join(orphan, "rootfs"), 0o755)
	s.Close()
	s2, err := image.Open(t.Context(), root, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
		t.Errorf("tmp leftovers %v", left)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan entry kept: %v", err)
	}
	if _, err := s2.Resolve(t.Context(), id); err != nil {
		t.Errorf("kept image lost: %v", err)
	}
}

func fmtHex(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "0123456789abcdef"[i%16]
	}
	return string(b)
}

// TestStoreLock: a store open elsewhere is refused with Conflict, and its
// work in progress is left alone; once closed it opens again.
func TestStoreLock(t *testing.T) {
	s, root := newStore(t, image.Options{})
	wip := filepath.Join(root, "tmp", "pull-in-progress")
	if err := os.MkdirAll(wip, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Open(t.Context(), root, image.Options{}); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("second open: %v, want Conflict", err)
	}
	if _, err := os.Stat(wip); err != nil {
		t.Errorf("second open touched the store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := image.Open(t.Context(), root, image.Options{})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	s2.Close()
}

// TestRemoveAmbiguousName: a name two app images carry is refused, with
// both listed; each is removed by ID, and the name works once it is unique.
func TestRemoveAmbiguousName(t *testing.T) {
	s, _ := newStore(t, image.Options{})
	ctx := t.Context()
	var ids []string
	for i, content := range []string{"one", "two"} {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p, _ := buildACI(t, dir, aciSpec{name: "kurma.dev/dup", files: map[string]string{"f": content}, exec: []string{"/f"}})
		img, err := s.Pull(ctx, "file://"+p, image.PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, img.ID)
	}
	err := s.Remove(ctx, "kurma.dev/dup")
	if !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("remove by an ambiguous name: %v, want Conflict", err)
	}
	for _, id := range ids {
		if !strings.Contains(err.Error(), id) {
			t.Errorf("refusal does not list %s: %v", id, err)
		}
	}
	if l, _ := s.List(ctx); len(l) != 2 {
		t.Fatalf("%d images after the refused remove, want 2", len(l))
	}
	if err := s.Remove(ctx, ids[0]); err != nil {
		t.Fatalf("remove by ID: %v", err)
	}
	if err := s.Remove(ctx, "kurma.dev/dup"); err != nil {
		t.Fatalf("remove by a name now unique: %v", err)
	}
}
