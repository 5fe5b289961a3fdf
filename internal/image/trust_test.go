package image_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestStagerTrust(t *testing.T) {
	priv, ring := keypair(t)
	otherPriv, _ := keypair(t)
	src := t.TempDir()
	stagerP, stagerID := buildACI(t, src, aciSpec{name: "kurma.dev/stager", files: map[string]string{"opt/stager/run": "x"}, exec: []string{"/opt/stager/run"}})
	baseP, baseID := buildACI(t, src, aciSpec{name: "kurma.dev/base", files: map[string]string{"b": "b"}})
	depP, depID := buildACI(t, src, aciSpec{name: "kurma.dev/dependent", deps: []appc.Dependency{{ImageName: "kurma.dev/base", ImageID: baseID}}})
	unsignedP, _ := buildACI(t, src, aciSpec{name: "kurma.dev/unsigned"})
	wrongP, wrongID := buildACI(t, src, aciSpec{name: "kurma.dev/wrong"})
	garbageP, _ := buildACI(t, src, aciSpec{name: "kurma.dev/garbage"})
	write := func(p string, b []byte) {
		if err := os.WriteFile(p+".sig", b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(stagerP, trust.Sign(priv, stagerID))
	write(depP, trust.Sign(priv, depID))
	write(baseP, trust.Sign(priv, baseID))
	write(wrongP, trust.Sign(otherPriv, wrongID))
	write(garbageP, []byte("kurma-ed25519-sig AAAA garbage"))

	tests := []struct {
		name    string
		uri     string
		ring    *trust.Keyring
		wantErr error
	}{
		{"signed", stagerP, ring, nil},
		{"missing signature", unsignedP, ring, kerrors.Unauthorized},
		{"wrong key", wrongP, ring, kerrors.Unauthorized},
		{"malformed signature", garbageP, ring, kerrors.Unauthorized},
		{"no keyring", stagerP, nil, kerrors.Unauthorized},
		{"dependent stager", depP, ring, kerrors.Unauthorized},
		{"docker stager", "docker://127.0.0.1:1/x:y", ring, kerrors.Unauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, root := newStore(t, image.Options{Keyring: tc.ring})
			if tc.name == "dependent stager" {
				if _, err := s.Pull(t.Context(), baseP, image.PullOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			before := dirEntries(t, filepath.Join(root, "entries"))
			img, err := s.Pull(t.Context(), tc.uri, image.PullOptions{RequireSignature: true})
			if tc.wantErr == nil {
				if err != nil || img.ID != stagerID {
					t.Fatalf("Pull = %v, %v", img, err)
				}
				// A stored, verified image is not re-fetched while its key
				// is trusted...
				if err := os.Rename(tc.uri+".sig", tc.uri+".sig.away"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Rename(tc.uri+".sig.away", tc.uri+".sig") })
				if _, err := s.Pull(t.Context(), tc.uri, image.PullOptions{RequireSignature: true}); err != nil {
					t.Fatal(err)
				}
				// ...but checked again once the key is no longer trusted.
				_, otherRing := keypair(t)
				s.Close()
				s2, err := image.Open(t.Context(), root, image.Options{Keyring: otherRing})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s2.Pull(t.Context(), tc.uri, image.PullOptions{RequireSignature: true}); !errors.Is(err, kerrors.Unauthorized) {
					t.Fatalf("pull with the key no longer trusted: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Pull = %v, want %v", err, tc.wantErr)
			}
			if after := dirEntries(t, filepath.Join(root, "entries")); len(after) != len(before) {
				t.Errorf("refused image left entries: %v", after)
			}
			if left := dirEntries(t, filepath.Join(root, "tmp")); len(left) != 0 {
				t.Errorf("tmp leftovers %v", left)
			}
		})
	}
}

// A stager image rebuilt at the same path and signed by a new key (as
// `make` does on a fresh checkout) replaces the stored one for a store that
// trusts only the new key, instead of failing on the stored image.
func TestStagerRebuiltAtSamePath(t *testing.T) {
	oldPriv, oldRing := keypair(t)
	newPriv, newRing := keypair(t)
	src := t.TempDir()
	p, oldID := buildACI(t, src, aciSpec{name: "kurma.dev/stager", files: map[string]string{"stager": "v1"}, exec: []string{"/stager"}})
	if err := os.WriteFile(p+".sig", trust.Sign(oldPriv, oldID), 0o644); err != nil {
		t.Fatal(err)
	}
	s, root := newStore(t, image.Options{Keyring: oldRing})
	if img, err := s.Pull(t.Context(), p, image.PullOptions{RequireSignature: true}); err != nil || img.ID != oldID {
		t.Fatalf("first pull = %v, %v", img, err)
	}
	s.Close()

	p2, newID := buildACI(t, src, aciSpec{name: "kurma.dev/stager", files: map[string]string{"stager": "v2"}, exec: []string{"/stager"}})
	if p2 != p || newID == oldID {
		t.Fatalf("rebuild: path %s id %s, want path %s and a new id", p2, newID, p)
	}
	if err := os.WriteFile(p+".sig", trust.Sign(newPriv, newID), 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := image.Open(t.Context(), root, image.Options{Keyring: newRing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	img, err := s2.Pull(t.Context(), p, image.PullOptions{RequireSignature: true})
	if err != nil || img.ID != newID {
		t.Fatalf("pull of the rebuilt image = %v, %v; want %s", img, err, newID)
	}
	// The old image's signature no longer verifies under the new key, and
	// a store that trusts neither refuses.
	_, otherRing := keypair(t)
	s2.Close()
	s3, err := image.Open(t.Context(), root, image.Options{Keyring: otherRing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3.Close() })
	if _, err := s3.Pull(t.Context(), p, image.PullOptions{RequireSignature: true}); !errors.Is(err, kerrors.Unauthorized) {
		t.Fatalf("pull trusting neither key: %v", err)
	}
}

func TestStagerTrustHTTP(t *testing.T) {
	priv, ring := keypair(t)
	src := t.TempDir()
	p, id := buildACI(t, src, aciSpec{name: "kurma.dev/stager", files: map[string]string{"x": "x"}})
	os.WriteFile(p+".sig", trust.Sign(priv, id), 0o644)
	unsigned, _ := buildACI(t, src, aciSpec{name: "kurma.dev/unsigned"})
	srv := httptest.NewServer(http.FileServer(http.Dir(src)))
	t.Cleanup(srv.Close)
	s, _ := newStore(t, image.Options{Keyring: ring})
	if _, err := s.Pull(t.Context(), srv.URL+"/"+filepath.Base(p), image.PullOptions{RequireSignature: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(t.Context(), srv.URL+"/"+filepath.Base(unsigned), image.PullOptions{RequireSignature: true}); !errors.Is(err, kerrors.Unauthorized) {
		t.Fatalf("unsigned over http: %v", err)
	}
}
