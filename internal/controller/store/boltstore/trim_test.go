package boltstore_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/boltstore"
)

// mappedKB is the resident size of this process's mappings of path, from
// /proc/self/smaps.
func mappedKB(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	total, in, found := 0, false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's header line
			in = fields[len(fields)-1] == path
			found = found || in
			continue
		}
		if in && fields[0] == "Rss:" && len(fields) >= 2 {
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatalf("smaps: %q: %v", sc.Text(), err)
			}
			total += n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("%s is not mapped", path)
	}
	return total
}

// A full scan maps every page of the file; the store then unmaps them
// (keeping the page cache), and reads afterwards still see every value.
func TestScanTrimsMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	s := open(t, path, boltstore.Options{NoSync: true})
	const n = 40000
	val := bytes.Repeat([]byte("v"), 200)
	kvs := make([]store.KV, n)
	for i := range kvs {
		kvs[i] = store.KV{Key: fmt.Sprintf("/ports/%08d", i), Value: val}
	}
	if err := s.BulkLoad(t.Context(), kvs); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	fileKB := int(fi.Size() / 1024)

	for round := range 2 {
		seen := 0
		if _, err := s.ForEach(t.Context(), "/ports/", func(kv store.KV) error {
			if !bytes.Equal(kv.Value, val) {
				return fmt.Errorf("%s = %q", kv.Key, kv.Value)
			}
			seen++
			return nil
		}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if seen != n {
			t.Fatalf("round %d: scanned %d keys, want %d", round, seen, n)
		}
		// The scan touched ~fileKB of the mapping; the trim runs in the
		// background right after it.
		deadline := time.Now().Add(5 * time.Second)
		for {
			kb := mappedKB(t, path)
			if kb < fileKB/10 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d kB of the %d kB file still mapped after a full scan", round, kb, fileKB)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	kv, err := s.Get(t.Context(), "/ports/00012345")
	if err != nil || !bytes.Equal(kv.Value, val) {
		t.Fatalf("get after trim: %+v %v", kv, err)
	}
}
