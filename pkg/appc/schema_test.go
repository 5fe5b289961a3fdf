package appc

import (
	"regexp"
	"strings"
	"testing"
)

// The patterns the hand-written validators implement.
var (
	imageIDRe = regexp.MustCompile(`^sha512-[0-9a-f]{32,128}$`)
	acNameRe  = regexp.MustCompile(`^[a-z0-9]+([-a-z0-9]*[a-z0-9])?$`)
	envNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func checkValidators(t *testing.T, s string) {
	t.Helper()
	if got, want := ValidImageID(s), imageIDRe.MatchString(s); got != want {
		t.Errorf("ValidImageID(%q) = %v, pattern says %v", s, got, want)
	}
	if got, want := ValidACName(s), len(s) <= 253 && acNameRe.MatchString(s); got != want {
		t.Errorf("ValidACName(%q) = %v, pattern says %v", s, got, want)
	}
	if got, want := ValidEnvName(s), envNameRe.MatchString(s); got != want {
		t.Errorf("ValidEnvName(%q) = %v, pattern says %v", s, got, want)
	}
}

func TestValidators(t *testing.T) {
	hex := strings.Repeat("0123456789abcdef", 8)
	for _, s := range []string{
		"", "a", "-", "a-", "-a", "a-b", "a--b", "A", "app1", "1app", "a_b", "a.b", "é",
		strings.Repeat("a", 253), strings.Repeat("a", 254),
		"_", "_x", "X_1", "1X", "PATH", "PATH=", "a b",
		"sha512-" + hex[:31], "sha512-" + hex[:32], "sha512-" + hex[:128], "sha512-" + hex + "0",
		"sha512-" + strings.ToUpper(hex[:32]), "sha256-" + hex[:64], "sha512-" + hex[:31] + "g",
		"sha512-" + hex[:32] + "\n",
	} {
		checkValidators(t, s)
	}
}

// FuzzValidators holds the validators to the patterns on any input.
func FuzzValidators(f *testing.F) {
	for _, s := range []string{"", "a-b", "sha512-" + strings.Repeat("ab", 20), "_X9", "-a", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkValidators(t, s) })
}
