package stager

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveIdentity(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "etc/passwd"), "# comment\nroot:x:0:0:root:/root:/bin/sh\nweb:x:33:33:web:/var/www:/bin/false\n1000:x:2000:2000::/home/num:/bin/sh\nbroken:x:abc:1::/:\n")
	writeFile(t, filepath.Join(root, "etc/group"), "root:x:0:\nwww:x:44:\n500:x:600:\n")
	writeFile(t, filepath.Join(root, "data/file"), "x")
	if err := os.Symlink("/data/file", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "data/file"))
	if err != nil {
		t.Fatal(err)
	}
	_ = fi
	myUID, myGID := uint32(os.Getuid()), uint32(os.Getgid())
	for _, tc := range []struct {
		name        string
		user, group string
		supp        []int
		want        Identity
		wantErr     error
	}{
		{name: "names", user: "web", group: "www", want: Identity{UID: 33, GID: 44, Home: "/var/www"}},
		{name: "numeric fallback", user: "77", group: "88", want: Identity{UID: 77, GID: 88, Home: "/"}},
		{name: "numeric name wins over number", user: "1000", group: "500", want: Identity{UID: 2000, GID: 600, Home: "/home/num"}},
		{name: "numeric uid gets its home", user: "0", group: "0", want: Identity{UID: 0, GID: 0, Home: "/root"}},
		{name: "file owner", user: "/data/file", group: "/link", want: Identity{UID: myUID, GID: myGID, Home: "/"}},
		{name: "supplementary", user: "0", group: "0", supp: []int{5, 6}, want: Identity{Home: "/root", Groups: []uint32{5, 6}}},
		{name: "unknown user", user: "nobody", group: "0", wantErr: kerrors.NotFound},
		{name: "unknown group", user: "0", group: "staff", wantErr: kerrors.NotFound},
		{name: "bad id in passwd ignored", user: "broken", group: "0", wantErr: kerrors.NotFound},
		{name: "missing file", user: "/nope", group: "0", wantErr: kerrors.NotFound},
		{name: "empty", user: "", group: "0", wantErr: kerrors.Invalid},
		{name: "negative supplementary", user: "0", group: "0", supp: []int{-1}, wantErr: kerrors.Invalid},
		{name: "uid out of range", user: "4294967296", group: "0", wantErr: kerrors.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveIdentity(root, tc.user, tc.group, tc.supp)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.UID != tc.want.UID || got.GID != tc.want.GID || got.Home != tc.want.Home || !slices.Equal(got.Groups, tc.want.Groups) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSecureJoin(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"abs":    "/c",
		"rel":    "a/b",
		"escape": "../../../../etc",
		"loop":   "loop",
		"a/up":   "../../..",
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "/a/b", want: "/a/b"},
		{in: "/abs/x", want: "/c/x"},
		{in: "/rel/x", want: "/a/b/x"},
		{in: "/escape/passwd", want: "/etc/passwd"},
		{in: "/../../etc", want: "/etc"},
		{in: "/a/up/c", want: "/c"},
		{in: "relative/p", want: "/relative/p"},
		{in: "/loop/x", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := SecureJoin(root, tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("got %q, want error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != filepath.Join(root, tc.want) {
				t.Errorf("got %q, want %q", got, filepath.Join(root, tc.want))
			}
		})
	}
}
