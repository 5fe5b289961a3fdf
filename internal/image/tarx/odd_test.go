package tarx_test

import (
	"archive/tar"
	"bytes"
	"testing"
	"time"

	"kurma.dev/kurma/internal/image/tarx"
)

// FIFOs, symlink loops and dangling symlinks on the way must neither block
// (opening a FIFO waits for a writer) nor loop: each case ends, with or
// without an error.
func TestExtractOddTreesFinish(t *testing.T) {
	tests := []struct {
		name string
		ents []ent
	}{
		{"opaque in symlinked fifo", []ent{{name: "p", typ: tar.TypeFifo}, {name: "s", typ: tar.TypeSymlink, link: "p"}, {name: "s/.wh..wh..opq", typ: tar.TypeReg}}},
		{"whiteout in fifo", []ent{{name: "p", typ: tar.TypeFifo}, {name: "p/.wh.x", typ: tar.TypeReg}}},
		{"symlink in symlinked fifo", []ent{{name: "p", typ: tar.TypeFifo}, {name: "s", typ: tar.TypeSymlink, link: "p"}, {name: "s/l", typ: tar.TypeSymlink, link: "x"}}},
		{"fifo in symlinked fifo", []ent{{name: "p", typ: tar.TypeFifo}, {name: "s", typ: tar.TypeSymlink, link: "p"}, {name: "s/q", typ: tar.TypeFifo}}},
		{"self symlink", []ent{{name: "a", typ: tar.TypeSymlink, link: "a"}, {name: "a/x", typ: tar.TypeReg, body: "x"}}},
		{"symlink loop", []ent{{name: "a", typ: tar.TypeSymlink, link: "b"}, {name: "b", typ: tar.TypeSymlink, link: "a"}, {name: "a/x/y", typ: tar.TypeReg, body: "x"}}},
		{"dangling symlink dir", []ent{{name: "a", typ: tar.TypeSymlink, link: "nothere"}, {name: "a/x/y", typ: tar.TypeReg, body: "x"}}},
		{"dir over symlinked fifo", []ent{{name: "p", typ: tar.TypeFifo}, {name: "s", typ: tar.TypeSymlink, link: "p"}, {name: "s/", typ: tar.TypeDir}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := tarx.Extract(t.Context(), bytes.NewReader(mkTar(t, tc.ents)), t.TempDir(), tarx.Options{Whiteouts: true})
				done <- err
			}()
			select {
			case err := <-done:
				t.Logf("result: %v", err)
			case <-time.After(5 * time.Second):
				t.Fatal("Extract blocked")
			}
		})
	}
}
