package image_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/pkg/kerrors"
)

// leaseStore opens a store holding two app images and returns it, its
// root and the images' IDs.
func leaseStore(t *testing.T) (*image.FSStore, string, [2]string) {
	t.Helper()
	s, root := newStore(t, image.Options{})
	var ids [2]string
	for i, name := range []string{"kurma.dev/leased-a", "kurma.dev/leased-b"} {
		p, id := buildACI(t, t.TempDir(), aciSpec{name: name, files: map[string]string{"f": name}, exec: []string{"/f"}})
		if _, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{}); err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return s, root, ids
}

// reopen closes s and opens its root again, as a restarted kurmad does.
func reopen(t *testing.T, s *image.FSStore, root string) *image.FSStore {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := image.Open(t.Context(), root, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	return s2
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// readLease returns the IDs in holder's lease file.
func readLease(t *testing.T, root, holder string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "leases", holder))
	must(t, err)
	var ids []string
	must(t, json.Unmarshal(b, &ids))
	return ids
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}

// indexJSON returns index.json's top-level fields.
func indexJSON(t *testing.T, root string) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "index.json"))
	must(t, err)
	idx := map[string]json.RawMessage{}
	must(t, json.Unmarshal(b, &idx))
	return idx
}

// TestLeaseFiles: a lease is a file of its own under leases/, that adds
// up, is not rewritten when nothing is new and goes with Unlease;
// index.json holds none.
func TestLeaseFiles(t *testing.T) {
	s, root, ids := leaseStore(t)
	ctx := t.Context()
	leases := filepath.Join(root, "leases")
	must(t, s.Lease(ctx, "pod-a", ids[0]))
	if got := readLease(t, root, "pod-a"); !slices.Equal(got, ids[:1]) {
		t.Errorf("lease file holds %v, want %v", got, ids[:1])
	}
	if _, ok := indexJSON(t, root)["leases"]; ok {
		t.Error("index.json holds leases")
	}
	ino := inode(t, filepath.Join(leases, "pod-a"))
	must(t, s.Lease(ctx, "pod-a", ids[0]))
	if inode(t, filepath.Join(leases, "pod-a")) != ino {
		t.Error("leasing again what a holder holds rewrote its file")
	}
	must(t, s.Lease(ctx, "pod-a", ids[1]))
	if got := readLease(t, root, "pod-a"); !slices.Equal(got, ids[:]) {
		t.Errorf("lease file after a second lease holds %v, want %v", got, ids)
	}
	if err := s.Remove(ctx, ids[0]); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove of the first leased image: %v, want Conflict", err)
	}
	must(t, s.Unlease(ctx, "pod-a"))
	if got := dirEntries(t, leases); len(got) != 0 {
		t.Errorf("lease files after unlease: %v", got)
	}
	for _, h := range []string{"pod-a", "pod-never"} {
		if err := s.Unlease(ctx, h); err != nil {
			t.Errorf("Unlease(%q) of a holder without lease: %v", h, err)
		}
	}
	if got := dirEntries(t, leases); len(got) != 0 {
		t.Errorf("lease files after unleases of unknown holders: %v", got)
	}
	must(t, s.Remove(ctx, ids[0]))
}

// TestLeaseRefused: bad holders and unknown images are refused with
// nothing written, and an existing lease is left as it was.
func TestLeaseRefused(t *testing.T) {
	s, root, ids := leaseStore(t)
	ctx := t.Context()
	must(t, s.Lease(ctx, "pod-a", ids[0]))
	before := indexJSON(t, root)
	for _, tc := range []struct {
		holder string
		ids    []string
		want   error
	}{
		{"", ids[:1], kerrors.Invalid},
		{"..", ids[:1], kerrors.Invalid},
		{".", ids[:1], kerrors.Invalid},
		{"../x", ids[:1], kerrors.Invalid},
		{"a/b", ids[:1], kerrors.Invalid},
		{"/abs", ids[:1], kerrors.Invalid},
		{".hidden", ids[:1], kerrors.Invalid},
		{".pod-a.tmp", ids[:1], kerrors.Invalid},
		{"pod a", ids[:1], kerrors.Invalid},
		{"pod\x00a", ids[:1], kerrors.Invalid},
		{strings.Repeat("a", 129), ids[:1], kerrors.Invalid},
		{"pod-x", []string{"sha512-nothere"}, kerrors.NotFound},
		{"pod-a", []string{ids[1], "sha512-nothere"}, kerrors.NotFound},
	} {
		if err := s.Lease(ctx, tc.holder, tc.ids...); !errors.Is(err, tc.want) {
			t.Errorf("Lease(%q, %v): %v, want %v", tc.holder, tc.ids, err, tc.want)
		}
		if tc.want == kerrors.Invalid {
			if err := s.Unlease(ctx, tc.holder); !errors.Is(err, kerrors.Invalid) {
				t.Errorf("Unlease(%q): %v, want Invalid", tc.holder, err)
			}
		}
	}
	if got := dirEntries(t, filepath.Join(root, "leases")); !slices.Equal(got, []string{"pod-a"}) {
		t.Errorf("lease files after refused leases: %v", got)
	}
	if got := readLease(t, root, "pod-a"); !slices.Equal(got, ids[:1]) {
		t.Errorf("pod-a's lease after refused leases: %v", got)
	}
	if got := indexJSON(t, root); string(got["entries"]) != string(before["entries"]) || string(got["refs"]) != string(before["refs"]) {
		t.Error("index.json changed by refused leases")
	}
}

// TestLeaseReopen: a reopened store honours lease files and removes what
// interrupted or crashed writes left: temp files, unreadable leases.
func TestLeaseReopen(t *testing.T) {
	s, root, ids := leaseStore(t)
	ctx := t.Context()
	leases := filepath.Join(root, "leases")
	must(t, s.Lease(ctx, "pod-a", ids[0]))
	for name, data := range map[string]string{
		".pod-b.tmp": `["` + ids[1] + `"]`, // a write kurmad never renamed
		"pod-c":      `["sha512-`,          // a machine crash's torn write
		"pod-d":      "",                   // or its empty file
		"pod-e":      `["../../x"]`,        // not an image ID
	} {
		must(t, os.WriteFile(filepath.Join(leases, name), []byte(data), 0o600))
	}
	must(t, os.Mkdir(filepath.Join(leases, "pod-f"), 0o700))
	s2 := reopen(t, s, root)
	if err := s2.Remove(ctx, ids[0]); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove leased after reopen: %v, want Conflict", err)
	}
	if got := dirEntries(t, leases); !slices.Equal(got, []string{"pod-a"}) {
		t.Errorf("lease files after reopen: %v", got)
	}
	must(t, s2.Remove(ctx, ids[1]))
	must(t, s2.Unlease(ctx, "pod-a"))
	s3 := reopen(t, s2, root)
	must(t, s3.Remove(ctx, ids[0]))
}

// TestLeaseMigration: the leases an index of the older format holds are
// honoured after the upgrade and moved into files; index.json keeps its
// entries and refs and drops them.
func TestLeaseMigration(t *testing.T) {
	s, root, ids := leaseStore(t)
	ctx := t.Context()
	must(t, s.Close())
	idx := indexJSON(t, root)
	old, err := json.Marshal(map[string][]string{"pod-old": {ids[0]}, "../bad": {ids[1]}})
	must(t, err)
	idx["leases"] = old
	b, err := json.Marshal(idx)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "index.json"), b, 0o600))

	s2 := reopen(t, s, root)
	if got := readLease(t, root, "pod-old"); !slices.Equal(got, ids[:1]) {
		t.Errorf("migrated lease holds %v", got)
	}
	if got := dirEntries(t, filepath.Join(root, "leases")); !slices.Equal(got, []string{"pod-old"}) {
		t.Errorf("lease files after migration: %v", got)
	}
	after := indexJSON(t, root)
	if _, ok := after["leases"]; ok {
		t.Error("index.json still holds leases after migration")
	}
	if string(after["entries"]) != string(idx["entries"]) || string(after["refs"]) != string(idx["refs"]) {
		t.Error("migration changed entries or refs")
	}
	if err := s2.Remove(ctx, ids[0]); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove after migration: %v, want Conflict", err)
	}
	s3 := reopen(t, s2, root)
	if err := s3.Remove(ctx, ids[0]); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove after migration and reopen: %v, want Conflict", err)
	}
	must(t, s3.Remove(ctx, ids[1])) // the invalid holder's lease was dropped
	must(t, s3.Unlease(ctx, "pod-old"))
	must(t, s3.Remove(ctx, ids[0]))
}

// BenchmarkLeaseUnlease measures a pod's lease and unlease of one image.
func BenchmarkLeaseUnlease(b *testing.B) {
	s, _ := newStore(b, image.Options{})
	p, id := buildACI(b, b.TempDir(), aciSpec{name: "kurma.dev/bench", files: map[string]string{"f": "f"}, exec: []string{"/f"}})
	if _, err := s.Pull(b.Context(), "file://"+p, image.PullOptions{}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := s.Lease(b.Context(), "pod-bench", id); err != nil {
			b.Fatal(err)
		}
		if err := s.Unlease(b.Context(), "pod-bench"); err != nil {
			b.Fatal(err)
		}
	}
}
