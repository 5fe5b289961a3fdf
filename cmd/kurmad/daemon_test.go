package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args []string
		want flags
		bad  bool
	}{
		{args: nil, want: flags{logLevel: "info"}},
		{args: []string{"--config", "/etc/kurma.yaml", "--socket", "/tmp/k.sock", "--log-level", "debug", "--stop-pods-on-exit"},
			want: flags{config: "/etc/kurma.yaml", socket: "/tmp/k.sock", logLevel: "debug", stopPods: true}},
		{args: []string{"--bogus"}, bad: true},
		{args: []string{"extra"}, bad: true},
	}
	for _, tc := range tests {
		f, err := parseFlags(tc.args, io.Discard)
		if tc.bad {
			if err == nil {
				t.Errorf("%v: accepted", tc.args)
			}
			continue
		}
		if err != nil || *f != tc.want {
			t.Errorf("%v: got %+v, %v; want %+v", tc.args, f, err, tc.want)
		}
	}
}

func TestLookupGroup(t *testing.T) {
	tests := []struct {
		in   string
		want int
		bad  bool
	}{
		{"", 0, false},
		{"0", 0, false},
		{"1234", 1234, false},
		{"root", 0, false},
		{"kapi-no-such-group", 0, true},
	}
	for _, tc := range tests {
		got, err := lookupGroup(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("lookupGroup(%q) = %d, %v", tc.in, got, err)
		}
	}
}

func TestLoadKeys(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	// A missing default key file is skipped: the daemon still starts.
	kr, err := loadKeys([]string{filepath.Join(dir, "missing.pub")}, log)
	if err != nil || kr.Len() != 0 {
		t.Fatalf("missing key: %v, %d keys", err, kr.Len())
	}
	bad := filepath.Join(dir, "bad.pub")
	if err := os.WriteFile(bad, []byte("not a key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadKeys([]string{bad}, log); err == nil {
		t.Fatal("malformed key accepted")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	if code := run([]string{"--log-level", "loud"}); code != 2 {
		t.Fatalf("bad log level: exit %d", code)
	}
	if code := run([]string{"--version"}); code != 0 {
		t.Fatalf("--version: exit %d", code)
	}
	if code := run([]string{"--config", filepath.Join(t.TempDir(), "none.yaml"), "--log-level", "error"}); code != 1 {
		t.Fatalf("missing config file: exit %d", code)
	}
}
