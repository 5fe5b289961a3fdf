package datapath

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoRawDumps enforces that netlink dumps go through nlsafe.go's retry
// wrappers: an interrupted dump must never be used as if it were complete.
func TestNoRawDumps(t *testing.T) {
	raw := regexp.MustCompile(`\.(LinkList|AddrList|RouteList|NeighList|NeighListExecute|RouteListFiltered|LinkSubscribe)\(`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "nlsafe.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if raw.MatchString(line) {
				t.Errorf("%s:%d: raw netlink dump; use the wrappers in nlsafe.go: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}
