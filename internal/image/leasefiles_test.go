package image_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/kerrors"
)

// TestLeaseFiles: a lease is a file of its own under leases/, gone with
// Unlease; index.json holds none; bad holders are refused with nothing
// written; reopening honours lease files, cleans temp files and drops a
// corrupt one; an index of the older format (leases inside) is migrated.
func TestLeaseFiles(t *testing.T) {
	s, root := newStore(t, image.Options{})
	ctx := t.Context()
	p, id := buildACI(t, t.TempDir(), aciSpec{name: "kurma.dev/leased", files: map[string]string{"f": "f"}, exec: []string{"/f"}})
	if _, err := s.Pull(ctx, "file://"+p, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := filepath.Join(root, "leases")
	readLease := func(holder string) []string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(leases, holder))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		if err := json.Unmarshal(b, &ids); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if err := s.Lease(ctx, "pod-a", id); err != nil {
		t.Fatal(err)
	}
	if got := readLease("pod-a"); !slices.Equal(got, []string{id}) {
		t.Errorf("lease file holds %v, want [%s]", got, id)
	}
	b, err := os.ReadFile(filepath.Join(root, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]json.RawMessage
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	if _, ok := idx["leases"]; ok {
		t.Errorf("index.json holds leases: %s", b)
	}

	for _, bad := range []string{"", "../x", "a/b", ".hidden", "..", string(make([]byte, 129))} {
		if err := s.Lease(ctx, bad, id); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("Lease(%q): %v, want Invalid", bad, err)
		}
		if err := s.Unlease(ctx, bad); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("Unlease(%q): %v, want Invalid", bad, err)
		}
	}
	if err := s.Lease(ctx, "pod-x", "sha512-nothere"); !errors.Is(err, kerrors.NotFound) {
		t.Errorf("lease of unknown image: %v", err)
	}
	if got := dirEntries(t, leases); !slices.Equal(got, []string{"pod-a"}) {
		t.Errorf("lease files after refused leases: %v", got)
	}

	// Reopen: leftovers of interrupted writes go, a corrupt lease is
	// dropped, pod-a's lease holds.
	s.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(leases, ".pod-b.tmp"), []byte("[]"), 0o600))
	must(os.WriteFile(filepath.Join(leases, "pod-c"), []byte("[\"sha512-"), 0o600))
	s2, err := image.Open(ctx, root, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove(ctx, id); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove leased after reopen: %v, want Conflict", err)
	}
	if got := dirEntries(t, leases); !slices.Equal(got, []string{"pod-a"}) {
		t.Errorf("lease files after reopen: %v", got)
	}
	must(s2.Unlease(ctx, "pod-a"))
	if got := dirEntries(t, leases); len(got) != 0 {
		t.Errorf("lease files after unlease: %v", got)
	}

	// An index of the older format, with the lease inside: honoured, and
	// moved into a file.
	s2.Close()
	idx["leases"], _ = json.Marshal(map[string][]string{"pod-old": {id}})
	b, _ = json.Marshal(idx)
	must(os.WriteFile(filepath.Join(root, "index.json"), b, 0o600))
	s3, err := image.Open(ctx, root, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3.Close() })
	if got := readLease("pod-old"); !slices.Equal(got, []string{id}) {
		t.Errorf("migrated lease holds %v", got)
	}
	if err := s3.Remove(ctx, id); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("remove after migration: %v, want Conflict", err)
	}
	after := map[string]json.RawMessage{}
	if b, _ := os.ReadFile(filepath.Join(root, "index.json")); json.Unmarshal(b, &after) != nil || after["leases"] != nil {
		t.Errorf("index.json still holds leases after migration: %s", b)
	}
	must(s3.Unlease(ctx, "pod-old"))
	must(s3.Remove(ctx, id))
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
