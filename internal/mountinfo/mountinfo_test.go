package mountinfo

import (
	"strings"
	"testing"
)

func TestUnescape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/plain/path", "/plain/path"},
		{`/with\040space`, "/with space"},
		{`/tab\011and\012newline`, "/tab\tand\nnewline"},
		{`/back\134slash`, `/back\slash`},
		{`/not\08octal`, `/not\08octal`},
		{`/too\777big`, `/too\777big`},
		{`/short\04`, `/short\04`},
		{`\`, `\`},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := Unescape(tt.in); got != tt.want {
				t.Errorf("Unescape(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzUnescape(f *testing.F) {
	for _, s := range []string{`/a\040b`, `\134\134`, `\0`, "/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Unescape(s)
		if len(got) > len(s) {
			t.Fatalf("Unescape(%q) grew to %q", s, got)
		}
		if !strings.Contains(s, `\`) && got != s {
			t.Fatalf("Unescape(%q) = %q changed a string without escapes", s, got)
		}
	})
}
