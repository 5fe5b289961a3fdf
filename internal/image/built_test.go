package image_test

import (
	"os"
	"path/filepath"
	"testing"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/internal/testutil"
)

// TestPullBuiltImages pulls the images `make build` produced (when present)
// in every form: ACI, OCI layout, docker-save tarball.
func TestPullBuiltImages(t *testing.T) {
	dir := os.Getenv("KURMA_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(testutil.RepoRoot(t), "bin")
	}
	imgs := filepath.Join(dir, "images")
	ring, _ := trust.LoadKeyring(filepath.Join(dir, "keys", "stager.pub"))
	s, _ := newStore(t, image.Options{Keyring: ring})
	found := 0
	for _, n := range []string{"busybox.aci", "busybox-oci", "busybox.tar", "hello.aci", "kurma-netplugin.aci", "kurma-stager.aci"} {
		p := filepath.Join(imgs, n)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		found++
		t.Run(n, func(t *testing.T) {
			_, sigErr := os.Stat(p + ".sig")
			img, err := s.Pull(t.Context(), "file://"+p, image.PullOptions{RequireSignature: sigErr == nil && ring != nil})
			if err != nil {
				t.Fatal(err)
			}
			ls, err := s.Resolve(t.Context(), img.ID)
			if err != nil || len(ls) == 0 {
				t.Fatalf("Resolve = %v, %v", ls, err)
			}
		})
	}
	if found == 0 {
		t.Skip("no built images (run make build)")
	}
}
