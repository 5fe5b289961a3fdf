package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestEachRef(t *testing.T) {
	tests := []struct {
		name    string
		refs    []string
		fail    map[string]bool
		printed string
		errs    []string
	}{
		{"all succeed", []string{"a", "b"}, nil, "a\nb\n", nil},
		{"goes on past a failure", []string{"a", "bad", "c"}, map[string]bool{"bad": true}, "a\nc\n", []string{"bad"}},
		{"all fail, errors joined", []string{"x", "y"}, map[string]bool{"x": true, "y": true}, "", []string{"x", "y"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			e := &env{stdout: &out}
			var called []string
			err := e.eachRef(tt.refs, func(ref string) error {
				called = append(called, ref)
				if tt.fail[ref] {
					return errors.New("no such pod " + ref)
				}
				return nil
			})
			if strings.Join(called, ",") != strings.Join(tt.refs, ",") {
				t.Errorf("called %v, want every ref %v", called, tt.refs)
			}
			if out.String() != tt.printed {
				t.Errorf("printed %q, want %q", out.String(), tt.printed)
			}
			if (err != nil) != (len(tt.errs) > 0) {
				t.Fatalf("err = %v, want errors for %v", err, tt.errs)
			}
			for _, ref := range tt.errs {
				if !strings.Contains(err.Error(), "no such pod "+ref) {
					t.Errorf("err %q does not mention %s", err, ref)
				}
			}
		})
	}
}
