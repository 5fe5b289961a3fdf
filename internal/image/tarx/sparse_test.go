package tarx_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/image/tarx"
	"kurma.dev/kurma/pkg/kerrors"
)

// gnuSparse builds an old-GNU sparse entry claiming a 1 TiB file made of
// one hole, from a single 512-byte header.
func gnuSparse() []byte {
	h := make([]byte, 512)
	copy(h[0:], "big")
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], "00000000000\x00") // physical size 0
	copy(h[136:], "00000000000\x00")
	h[156] = 'S'
	copy(h[257:], "ustar  \x00")
	real := fmt.Sprintf("%011o\x00", int64(1)<<40)
	copy(h[386:], real) // sparse[0].offset = end of file
	copy(h[398:], "00000000000\x00")
	copy(h[483:], real) // real size
	copy(h[148:], "        ")
	sum := 0
	for _, b := range h {
		sum += int(b)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return append(h, make([]byte, 1024)...)
}

func TestSparseRefused(t *testing.T) {
	target := t.TempDir()
	_, err := tarx.Extract(t.Context(), bytes.NewReader(gnuSparse()), target, tarx.Options{})
	if !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), "sparse") {
		t.Fatalf("sparse entry: %v, want Invalid (sparse)", err)
	}
	if fi, err := os.Stat(filepath.Join(target, "big")); err == nil {
		t.Errorf("sparse file written, size %d", fi.Size())
	}
}
