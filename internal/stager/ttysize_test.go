package stager

import (
	"fmt"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/appc"
)

func TestTTYSize(t *testing.T) {
	tests := []struct {
		name       string
		anns       []appc.Annotation
		rows, cols uint16
	}{
		{"none", nil, 0, 0},
		{"size", []appc.Annotation{{Name: TTYSizeAnnotation, Value: "31x97"}}, 31, 97},
		{"other annotations first", []appc.Annotation{{Name: "x", Value: "1x1"}, {Name: TTYSizeAnnotation, Value: "24x80"}}, 24, 80},
		{"no separator", []appc.Annotation{{Name: TTYSizeAnnotation, Value: "2480"}}, 0, 0},
		{"negative", []appc.Annotation{{Name: TTYSizeAnnotation, Value: "-1x80"}}, 0, 0},
		{"too large", []appc.Annotation{{Name: TTYSizeAnnotation, Value: "70000x80"}}, 0, 0},
		{"trailing junk", []appc.Annotation{{Name: TTYSizeAnnotation, Value: "24x80x1"}}, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, c := ttySize(appc.RuntimeApp{Name: "a", Annotations: tc.anns})
			if r != tc.rows || c != tc.cols {
				t.Errorf("ttySize = %dx%d, want %dx%d", r, c, tc.rows, tc.cols)
			}
		})
	}
}

func FuzzTTYSize(f *testing.F) {
	for _, s := range []string{"24x80", "0x0", "x", "65535x65535", "1x", "ax1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, c := ttySize(appc.RuntimeApp{Annotations: []appc.Annotation{{Name: TTYSizeAnnotation, Value: v}}})
		if r == 0 && c == 0 {
			return
		}
		var r2, c2 uint16
		if _, err := fmt.Sscanf(v, "%dx%d", &r2, &c2); err != nil || r2 != r || c2 != c || strings.Count(v, "x") != 1 || strings.ContainsAny(v, "+- ") {
			t.Fatalf("%q parsed as %dx%d", v, r, c)
		}
	})
}
