package mountinfo

import "strings"

// Unescape undoes the octal escapes the kernel writes in mountinfo paths
// (`\040` for a space, `\011` tab, `\012` newline, `\134` backslash). A
// backslash not followed by three octal digits is kept as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, ok := octal3(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// octal3 decodes three octal digits that fit a byte (at most \377).
func octal3(d string) (byte, bool) {
	v := 0
	for i := 0; i < 3; i++ {
		c := d[i]
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	if v > 0xff {
		return 0, false
	}
	return byte(v), true
}
