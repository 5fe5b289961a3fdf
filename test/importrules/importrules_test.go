package importrules

import (
	"bufio"
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/testutil"
)

// rule is one "Must not import:" or "Must not depend on:" sentence.
type rule struct {
	deny, except []string
	// transitive: the rule covers every dependency ("depend on"), not
	// only the package's own imports.
	transitive bool
}

// The two rule forms.
const (
	importMarker = "Must not import:"
	dependMarker = "Must not depend on:"
)

// parseRule finds the rule in a package comment; ok is false when there
// is none. A sentence that starts with a marker but lists no backquoted
// pattern is an error, so a rule cannot silently stop applying.
func parseRule(doc string) (r rule, ok bool, err string) {
	// A rule may be broken across lines anywhere, the marker included.
	doc = strings.Join(strings.Fields(doc), " ")
	marker := importMarker
	i := strings.Index(doc, marker)
	if j := strings.Index(doc, dependMarker); j >= 0 && (i < 0 || j < i) {
		i, marker, r.transitive = j, dependMarker, true
	}
	if i < 0 {
		return r, false, ""
	}
	list := &r.deny
	inQuote := false
	var tok, word strings.Builder
	for _, c := range doc[i+len(marker):] {
		switch {
		case c == '`':
			if inQuote {
				*list = append(*list, tok.String())
				tok.Reset()
			}
			inQuote = !inQuote
		case inQuote:
			tok.WriteRune(c)
		case c == '.':
			if len(r.deny) == 0 {
				return r, true, "rule lists no `pattern`"
			}
			return r, true, ""
		default:
			if c == ' ' || c == '\n' || c == '(' || c == ',' {
				if word.String() == "except" {
					list = &r.except
				}
				word.Reset()
			} else {
				word.WriteRune(c)
			}
		}
	}
	return r, true, "rule does not end with a period"
}

// parseRules finds every rule in a package comment (a comment may state
// both forms, or show one as an example before its own), each parsed as
// parseRule parses the first.
func parseRules(doc string) (rs []rule, errs []string) {
	doc = strings.Join(strings.Fields(doc), " ")
	for {
		r, ok, err := parseRule(doc)
		if !ok {
			return rs, errs
		}
		if err != "" {
			errs = append(errs, err)
		} else {
			rs = append(rs, r)
		}
		i, n := strings.Index(doc, importMarker), len(importMarker)
		if j := strings.Index(doc, dependMarker); j >= 0 && (i < 0 || j < i) {
			i, n = j, len(dependMarker)
		}
		doc = doc[i+n:]
	}
}

func matches(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// broken returns the dependencies deps that the rule forbids.
func (r rule) broken(deps []string) []string {
	var out []string
	for _, d := range deps {
		if slices.ContainsFunc(r.deny, func(p string) bool { return matches(p, d) }) &&
			!slices.ContainsFunc(r.except, func(p string) bool { return matches(p, d) }) {
			out = append(out, d)
		}
	}
	return out
}

// packageDoc returns the package comment of the non-test files in dir.
func packageDoc(t *testing.T, dir string) string {
	fset := token.NewFileSet()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			docs = append(docs, f.Doc.Text())
		}
	}
	return strings.Join(docs, "\n")
}

// TestImportRules checks every package's stated rule against its
// dependencies.
func TestImportRules(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not in PATH")
	}
	root := testutil.RepoRoot(t)
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rules := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 4 {
			continue
		}
		pkg, dir := f[0], f[1]
		rs, errs := parseRules(packageDoc(t, dir))
		for _, e := range errs {
			t.Errorf("%s: %s", pkg, e)
		}
		if len(rs) > 0 {
			rules++
		}
		for _, r := range rs {
			deps, verb := strings.Fields(f[2]), "imports"
			if r.transitive {
				deps, verb = strings.Fields(f[3]), "depends on"
			}
			if b := r.broken(deps); len(b) > 0 {
				t.Errorf("%s breaks its rule (%v, except %v): it %s %v", pkg, r.deny, r.except, verb, b)
			}
		}
	}
	if rules < 24 {
		t.Errorf("only %d packages state an import rule; the package comments state at least 24", rules)
	}
}

func TestParseRule(t *testing.T) {
	tests := []struct {
		name, doc    string
		ok           bool
		err          string
		deny, except []string
	}{
		{"none", "Package x does things.", false, "", nil, nil},
		{"simple", "Text.\n\nMust not import: `net/http`, `kurma.dev/kurma/internal/pod/...`. More.", true, "",
			[]string{"net/http", "kurma.dev/kurma/internal/pod/..."}, nil},
		{"except", "Must not import: `kurma.dev/kurma/...` (except\n`kurma.dev/kurma/pkg/kerrors`).", true, "",
			[]string{"kurma.dev/kurma/..."}, []string{"kurma.dev/kurma/pkg/kerrors"}},
		{"no pattern", "Must not import: the daemon.", true, "rule lists no `pattern`", nil, nil},
		{"marker broken across a line", "It uses x. Must not\nimport: `net/http`.", true, "", []string{"net/http"}, nil},
		{"depend marker broken", "Must not depend\n  on: `a`.", true, "", []string{"a"}, nil},
		{"no period", "Must not import: `a`", true, "rule does not end with a period", []string{"a"}, nil},
		{"depend", "Must not depend on: `net/http`.", true, "", []string{"net/http"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok, err := parseRule(tt.doc)
			if ok != tt.ok || err != tt.err || !slices.Equal(r.deny, tt.deny) || !slices.Equal(r.except, tt.except) {
				t.Errorf("parseRule = %+v %v %q, want %v %v %q %v", r, ok, err, tt.deny, tt.except, tt.err, tt.ok)
			}
		})
	}
	// Every rule of a comment counts, the second too (a comment that
	// shows the form before stating its own rule).
	rs, errs := parseRules("Example:\n\tMust not import: `PATTERN`.\n\nMust not\nimport: `a/...`. Must not depend on: `net/http`.")
	if len(errs) != 0 || len(rs) != 3 || rs[1].deny[0] != "a/..." || !rs[2].transitive || rs[2].deny[0] != "net/http" {
		t.Errorf("parseRules = %+v, %v; want 3 rules, the last two a/... and (depend) net/http", rs, errs)
	}
	r := rule{deny: []string{"kurma.dev/kurma/..."}, except: []string{"kurma.dev/kurma/pkg/kerrors"}}
	if got := r.broken([]string{"fmt", "kurma.dev/kurma/pkg/kerrors", "kurma.dev/kurma/internal/pod", "kurma.dev/kurmax"}); !slices.Equal(got, []string{"kurma.dev/kurma/internal/pod"}) {
		t.Errorf("broken = %v", got)
	}
}
