package podtypes

import (
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestValidate(t *testing.T) {
	app := AppSpec{Image: "docker://busybox"}
	tests := []struct {
		name string
		spec Spec
		want string // "" valid; else a part of the message
	}{
		{"minimal", Spec{Apps: []AppSpec{app}}, ""},
		{"bad pod name", Spec{Name: "a/b", Apps: []AppSpec{app}}, "invalid pod name"},
		{"no apps", Spec{}, "no apps"},
		{"no image", Spec{Apps: []AppSpec{{Name: "a"}}}, "no image"},
		{"empty exec", Spec{Apps: []AppSpec{{Image: "x", Exec: []string{""}}}}, "empty executable"},
		{"bad app name", Spec{Apps: []AppSpec{{Name: "A_B", Image: "x"}}}, "invalid name"},
		{"duplicate app", Spec{Apps: []AppSpec{{Name: "a", Image: "x"}, {Name: "a", Image: "y"}}}, "duplicate app"},
		{"bad env", Spec{Apps: []AppSpec{{Image: "x", Env: []appc.EnvVar{{Name: "1X"}}}}}, "environment variable"},
		{"volume kind", Spec{Apps: []AppSpec{app}, Volumes: []appc.Volume{{Name: "v", Kind: "nfs"}}}, "unknown kind"},
		{"relative host source", Spec{Apps: []AppSpec{app}, Volumes: []appc.Volume{{Name: "v", Kind: "host", Source: "rel"}}}, "absolute path"},
		{"empty with source", Spec{Apps: []AppSpec{app}, Volumes: []appc.Volume{{Name: "v", Kind: "empty", Source: "/x"}}}, "no source"},
		{"duplicate volume", Spec{Apps: []AppSpec{app}, Volumes: []appc.Volume{{Name: "v", Kind: "empty"}, {Name: "v", Kind: "empty"}}}, "duplicate volume"},
		{"unknown mount", Spec{Apps: []AppSpec{{Image: "x", Mounts: []appc.Mount{{Volume: "v", Path: "/d"}}}}}, "unknown volume"},
		{"relative mount", Spec{Volumes: []appc.Volume{{Name: "v", Kind: "empty"}}, Apps: []AppSpec{{Image: "x", Mounts: []appc.Mount{{Volume: "v", Path: "d"}}}}}, "not absolute"},
		{"empty network", Spec{Apps: []AppSpec{app}, Networks: []string{" "}}, "empty network"},
		{"host with others", Spec{Apps: []AppSpec{app}, Networks: []string{"host", "a"}}, "cannot be combined"},
		{"host alone", Spec{Apps: []AppSpec{app}, Networks: []string{"host"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, kerrors.Invalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want Invalid containing %q", err, tt.want)
			}
		})
	}
}
