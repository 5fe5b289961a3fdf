package pod

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStagerReason(t *testing.T) {
	tests := []struct {
		name, log, want string
	}{
		{"kurma stager", "time=x level=INFO msg=start\nkurma-stager stager: app \"web\": exec \"/bin/nope\": no such file or directory\n",
			`app "web": exec "/bin/nope": no such file or directory`},
		{"other stager", "booting\nno such user bob\n\n", "no such user bob"},
		{"only structured lines", "time=x level=ERROR msg=boom\n{\"msg\":\"x\"}\n", ""},
		{"empty", "", ""},
		{"long line cut", strings.Repeat("x", 2000), strings.Repeat("x", 512) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "stager.log")
			if err := os.WriteFile(p, []byte(tt.log), 0o600); err != nil {
				t.Fatal(err)
			}
			if got, _ := stagerReason(p); got != tt.want {
				t.Errorf("reason %q, want %q", got, tt.want)
			}
		})
	}
	if got, tail := stagerReason(filepath.Join(t.TempDir(), "none")); got != "" || tail != "" {
		t.Errorf("missing log: %q %q", got, tail)
	}
}
