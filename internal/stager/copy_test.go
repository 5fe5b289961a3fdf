package stager

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/testutil"
)

func TestCopyLayerWhiteouts(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	lower, upper, dst := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "dst")
	for _, d := range []string{lower + "/etc", lower + "/opq/sub", lower + "/keep", upper + "/etc", upper + "/opq", upper + "/keep", dst} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, lower+"/etc/gone", "1")
	writeFile(t, lower+"/etc/stays", "1")
	writeFile(t, lower+"/opq/sub/old", "1")
	writeFile(t, lower+"/keep/a", "lower")
	writeFile(t, lower+"/filebecomesdir", "1")
	if err := os.Symlink("/etc/stays", lower+"/link"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(lower+"/etc/stays", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(lower+"/etc/stays", 0o4711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(upper+"/etc/gone", unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(upper+"/opq", opaqueXattr, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	writeFile(t, upper+"/opq/new", "2")
	writeFile(t, upper+"/keep/b", "upper")
	writeFile(t, upper+"/keep/a", "upper")
	writeFile(t, upper+"/filebecomesdir/x", "2")
	if err := unix.Mkfifo(upper+"/fifo", 0o600); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{lower, upper} {
		if err := CopyLayer(l, dst); err != nil {
			t.Fatalf("copy %s: %v", l, err)
		}
	}
	for _, tc := range []struct {
		path    string
		exists  bool
		content string
	}{
		{"etc/gone", false, ""},
		{"etc/stays", true, "1"},
		{"opq/sub", false, ""},
		{"opq/new", true, "2"},
		{"keep/a", true, "upper"},
		{"keep/b", true, "upper"},
		{"filebecomesdir/x", true, "2"},
		{"fifo", true, ""},
		{"link", true, ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			p := filepath.Join(dst, tc.path)
			_, err := os.Lstat(p)
			if tc.exists != (err == nil) {
				t.Fatalf("exists=%v, err %v", tc.exists, err)
			}
			if tc.content != "" {
				b, _ := os.ReadFile(p)
				if string(b) != tc.content {
					t.Errorf("content %q, want %q", b, tc.content)
				}
			}
		})
	}
	var st unix.Stat_t
	if err := unix.Stat(dst+"/etc/stays", &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1234 || st.Gid != 5678 || st.Mode&0o7777 != 0o4711 {
		t.Errorf("owner/mode not kept: %d:%d %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if l, _ := os.Readlink(dst + "/link"); l != "/etc/stays" {
		t.Errorf("symlink %q", l)
	}
	if isOpaque(dst + "/opq") {
		t.Error("opaque marker copied into the merged tree")
	}
}
