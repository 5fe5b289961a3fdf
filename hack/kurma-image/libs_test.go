package main

import (
	"slices"
	"testing"
)

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibnftables.so.1 => /lib/x86_64-linux-gnu/libnftables.so.1 (0x00007f60)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f61)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f62)\n"
	got, err := parseLdd([]byte(out))
	want := []string{"/lib/x86_64-linux-gnu/libnftables.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %q %v, want %q", got, err, want)
	}
	if _, err := parseLdd([]byte("\tlibfoo.so.1 => not found\n")); err == nil {
		t.Fatal("missing library: no error")
	}
}
