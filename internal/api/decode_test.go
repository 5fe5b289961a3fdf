package api

import (
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestDecodeCreatePodRequest(t *testing.T) {
	tests := []struct {
		name, body string
		ok         bool
	}{
		{"minimal", `{"spec":{"apps":[{"image":"busybox"}]}}`, true},
		{"full", `{"spec":{"name":"web-1","apps":[{"name":"a","image":"docker://r/x:1","exec":["sh"],"env":[{"name":"A","value":"1"}],"mounts":[{"volume":"data","path":"/data"}]}],"volumes":[{"name":"data","kind":"empty"},{"name":"h","kind":"host","source":"/tmp"}],"networks":["host"]},"wait":true,"remove":true,"stdin":true}`, true},
		{"unknown field", `{"spec":{"apps":[{"image":"x"}]},"bogus":1}`, false},
		{"stdin content", `{"spec":{"apps":[{"image":"x","stdin":"e30K"}]}}`, true},
		{"reserved hostIPC", `{"spec":{"apps":[{"image":"x"}],"hostIPC":true}}`, false},
		{"reserved hostUTS", `{"spec":{"apps":[{"image":"x"}],"hostUTS":true}}`, false},
		{"reserved volumePropagation", `{"spec":{"apps":[{"image":"x"}],"volumePropagation":true}}`, false},
		{"reserved hostPrivileged", `{"spec":{"apps":[{"image":"x","hostPrivileged":true}]}}`, false},
		{"trailing", `{"spec":{"apps":[{"image":"x"}]}} {}`, false},
		{"no apps", `{"spec":{"name":"x"}}`, false},
		{"no image", `{"spec":{"apps":[{"name":"a"}]}}`, false},
		{"bad app name", `{"spec":{"apps":[{"name":"A/B","image":"x"}]}}`, false},
		{"duplicate app", `{"spec":{"apps":[{"name":"a","image":"x"},{"name":"a","image":"y"}]}}`, false},
		{"bad pod name", `{"spec":{"name":"a b","apps":[{"image":"x"}]}}`, false},
		{"bad env", `{"spec":{"apps":[{"image":"x","env":[{"name":"1A","value":""}]}]}}`, false},
		{"unknown volume", `{"spec":{"apps":[{"image":"x","mounts":[{"volume":"v","path":"/v"}]}]}}`, false},
		{"relative mount", `{"spec":{"apps":[{"image":"x","mounts":[{"volume":"v","path":"v"}]}],"volumes":[{"name":"v","kind":"empty"}]}}`, false},
		{"relative host", `{"spec":{"apps":[{"image":"x"}],"volumes":[{"name":"v","kind":"host","source":"tmp"}]}}`, false},
		{"bad kind", `{"spec":{"apps":[{"image":"x"}],"volumes":[{"name":"v","kind":"nfs"}]}}`, false},
		{"remove without wait", `{"spec":{"apps":[{"image":"x"}]},"remove":true}`, false},
		{"empty exec", `{"spec":{"apps":[{"image":"x","exec":[""]}]}}`, false},
		{"empty network", `{"spec":{"apps":[{"image":"x"}],"networks":[""]}}`, false},
		{"not json", `spec`, false},
		{"too big", `{"spec":{"name":"` + strings.Repeat("a", MaxBodyBytes) + `"}}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeCreatePodRequest(strings.NewReader(tc.body))
			if tc.ok && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !tc.ok && !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("err = %v, want Invalid", err)
			}
		})
	}
}

func FuzzDecodeCreatePodRequest(f *testing.F) {
	for _, s := range []string{
		`{"spec":{"apps":[{"image":"busybox"}]}}`,
		`{"spec":{"name":"web-1","apps":[{"name":"a","image":"docker://r/x:1","exec":["sh"],"env":[{"name":"A","value":"1"}],"mounts":[{"volume":"data","path":"/data"}]}],"volumes":[{"name":"data","kind":"empty"}]},"wait":true,"remove":true}`,
		`{"spec":{"apps":[{"image":"x"}],"volumes":[{"name":"v","kind":"host","source":"/"}]}}`,
		`{}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeCreatePodRequest(strings.NewReader(string(data)))
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error not Invalid: %v", err)
			}
			return
		}
		// Whatever is accepted is a usable spec.
		if len(req.Spec.Apps) == 0 {
			t.Fatal("accepted a pod without apps")
		}
		if req.Spec.Name != "" && !ValidPodName(req.Spec.Name) {
			t.Fatalf("accepted bad name %q", req.Spec.Name)
		}
		if err := ValidateSpec(&req.Spec); err != nil {
			t.Fatalf("accepted spec fails validation: %v", err)
		}
		for _, a := range req.Spec.Apps {
			if strings.TrimSpace(a.Image) == "" {
				t.Fatal("accepted app without image")
			}
			n := generateName(a)
			if !ValidPodName(n) {
				t.Fatalf("generated invalid name %q from %q", n, a.Image)
			}
		}
	})
}
