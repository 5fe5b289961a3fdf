package pod

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOpenInRoot(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "logs", "app"), []byte("log"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range [][2]string{{outside, "logs/link"}, {filepath.Dir(outside), "dirlink"}} {
		if err := os.Symlink(l[0], filepath.Join(root, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "logs", "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		rel string
		ok  bool
	}{
		{"logs/app", true},
		{"logs/link", false},
		{"dirlink/secret", false},
		{"../" + filepath.Base(root) + "/logs/app", false},
		{"logs/adir", false},
		{"logs/missing", false},
	}
	for _, tc := range tests {
		t.Run(tc.rel, func(t *testing.T) {
			f, err := openInRoot(root, tc.rel)
			if f != nil {
				f.Close()
			}
			if (err == nil) != tc.ok {
				t.Errorf("openInRoot(%q): %v, want ok=%v", tc.rel, err, tc.ok)
			}
		})
	}
}
