package stager

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAppLogRotation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int64
		writes []string
	}{
		{"under the limit", 100, []string{"abc", "def"}},
		{"exactly at the limit", 6, []string{"abc", "def"}},
		{"one rotation", 10, []string{"0123456789", "abcdef"}},
		{"a write larger than the limit", 4, []string{"0123456789ab"}},
		{"many rotations keep one old file", 8, []string{strings.Repeat("x", 7), strings.Repeat("y", 7), strings.Repeat("z", 7), "end"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app")
			l, err := openAppLog(path, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			var all bytes.Buffer
			for _, w := range tc.writes {
				if n, err := l.Write([]byte(w)); err != nil || n != len(w) {
					t.Fatalf("write %q: %d %v", w, n, err)
				}
				all.WriteString(w)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			cur, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			old, _ := os.ReadFile(path + ".1")
			for _, b := range [][]byte{cur, old} {
				if int64(len(b)) > tc.max {
					t.Errorf("file of %d bytes over the %d limit", len(b), tc.max)
				}
			}
			got := string(old) + string(cur)
			if !strings.HasSuffix(all.String(), got) {
				t.Errorf("old+current %q is not the tail of %q", got, all.String())
			}
			if min(int64(all.Len()), tc.max+1) > int64(len(got)) {
				t.Errorf("kept only %d bytes of %d", len(got), all.Len())
			}
			if _, err := os.Stat(path + ".2"); err == nil {
				t.Error("a second old generation exists")
			}
		})
	}
}

func TestAppLogReopenKeepsSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(path, []byte("12345678"), 0o640); err != nil {
		t.Fatal(err)
	}
	l, err := openAppLog(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Write([]byte("abcd")); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if string(old) != "12345678ab" || string(cur) != "cd" {
		t.Errorf("old %q current %q", old, cur)
	}
}
