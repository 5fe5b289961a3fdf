package pod

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// pullTinyImage builds a one-file ACI named name and pulls it into s.
func pullTinyImage(t *testing.T, s *image.FSStore, name string) string {
	t.Helper()
	var buf bytes.Buffer
	b, err := acibuild.NewACI(&buf, appc.ImageManifest{Name: name, App: &appc.App{Exec: []string{"/f"}, User: "0", Group: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.File("f", 0o755, []byte(name)); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "image.aci")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return img.ID
}

// TestRecoverLeasesKeptPods: after a machine crash lost a lease file whose
// pod record survived, recovery leases the pod's app images again, so
// they cannot be removed before the pod is; a lease that survived is left
// as it was (with the stager image the record does not name); pods rolled
// back or that never leased get no lease.
func TestRecoverLeasesKeptPods(t *testing.T) {
	if testing.Short() {
		t.Skip("root integration test (not in -short)")
	}
	testutil.RequireRoot(t)
	ctx := t.Context()
	base := t.TempDir()
	store, err := image.Open(ctx, filepath.Join(base, "images"), image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	stagerID := pullTinyImage(t, store, "kurma.dev/lease-stager")
	leasesDir := filepath.Join(base, "images", "leases")

	pods := []struct {
		name      string
		state     State
		leased    bool
		keepLease bool // its lease file survived
		wantLease bool
	}{
		{name: "exited-lease-kept", state: Exited, leased: true, keepLease: true, wantLease: true},
		{name: "exited-lease-lost", state: Exited, leased: true, wantLease: true},
		{name: "running-lease-lost", state: Running, leased: true, wantLease: true}, // its stager died in the crash
		{name: "creating", state: Creating, leased: true},
		{name: "never-leased", state: Exited},
	}
	podsDir := filepath.Join(base, "pods")
	uuids := make([]string, len(pods))
	imgs := make([]string, len(pods))
	for i, p := range pods {
		uuids[i] = uuid.NewString()
		imgs[i] = pullTinyImage(t, store, "kurma.dev/lease-"+p.name)
		rec := &record{
			Pod: Pod{
				UUID: uuids[i], Name: p.name, State: p.state, Created: time.Now().UTC(),
				Apps: []AppInfo{{Name: "app", Image: "kurma.dev/lease-" + p.name, ImageID: imgs[i]}},
			},
			Leased: p.leased,
		}
		dir := filepath.Join(podsDir, uuids[i])
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(dir, rec, false); err != nil {
			t.Fatal(err)
		}
		if p.keepLease {
			if err := store.Lease(ctx, uuids[i], stagerID, imgs[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	kept := filepath.Join(leasesDir, uuids[0])
	fi, err := os.Stat(kept)
	if err != nil {
		t.Fatal(err)
	}
	keptIno := fi.Sys().(*syscall.Stat_t).Ino

	rt, err := New(ctx, Options{
		PodsDir:     podsDir,
		VolumesDir:  filepath.Join(base, "volumes"),
		Images:      store,
		StagerImage: "file:///test/none.aci",
		CgroupRoot:  testutil.UniqueName("kpod"),
		NoSpare:     true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rt.Close(ctx)
	})

	var want []string
	for i, p := range pods {
		err := store.Remove(ctx, imgs[i])
		if p.wantLease {
			want = append(want, uuids[i])
			if !errors.Is(err, kerrors.Conflict) {
				t.Errorf("%s: image removed after recovery: %v, want Conflict", p.name, err)
			}
		} else if err != nil {
			t.Errorf("%s: remove image after recovery: %v", p.name, err)
		}
	}
	slices.Sort(want)
	if got := dirEntries(t, leasesDir); !slices.Equal(got, want) {
		t.Errorf("lease files after recovery: %v, want %v", got, want)
	}
	if fi, err := os.Stat(kept); err != nil || fi.Sys().(*syscall.Stat_t).Ino != keptIno {
		t.Errorf("a lease that survived was rewritten (%v)", err)
	}
	if err := store.Remove(ctx, stagerID); !errors.Is(err, kerrors.Conflict) {
		t.Errorf("stager image of a surviving lease removed: %v, want Conflict", err)
	}
	// Removing the pods releases their images.
	for i, p := range pods {
		if !p.wantLease {
			continue
		}
		if err := rt.Remove(ctx, uuids[i], false); err != nil {
			t.Fatalf("remove pod %s: %v", p.name, err)
		}
		if err := store.Remove(ctx, imgs[i]); err != nil {
			t.Errorf("%s: remove image after the pod: %v", p.name, err)
		}
	}
	if err := store.Remove(ctx, stagerID); err != nil {
		t.Errorf("remove stager image after the pods: %v", err)
	}
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
