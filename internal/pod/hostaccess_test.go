package pod

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

func TestHostAccess(t *testing.T) {
	declared := appc.ImageManifest{Labels: []appc.Label{{Name: HostPrivilegedLabel, Value: "true"}}}
	annotated := appc.ImageManifest{Annotations: []appc.Annotation{{Name: HostPrivilegedLabel, Value: "true"}}}
	imgRetain := appc.Isolator{Name: isolatorCapsRetain, Value: []byte(`{"set":["CAP_SYS_MODULE"]}`)}
	for _, tc := range []struct {
		name      string
		app       AppSpec
		img       appc.ImageManifest
		wantCaps  bool // the host-privileged retain set and annotation
		wantStdin string
		wantErr   bool
	}{
		{name: "plain", app: AppSpec{Name: "a"}},
		{name: "asks, image silent", app: AppSpec{Name: "a", HostPrivileged: true}},
		{name: "image declares, not asked", app: AppSpec{Name: "a"}, img: declared},
		{name: "asked and label", app: AppSpec{Name: "a", HostPrivileged: true}, img: declared, wantCaps: true},
		{name: "asked and annotation", app: AppSpec{Name: "a", HostPrivileged: true}, img: annotated, wantCaps: true},
		{name: "stdin", app: AppSpec{Name: "a", Stdin: []byte("{}\n")}, wantStdin: "{}\n"},
		{name: "stdin with tty", app: AppSpec{Name: "a", Stdin: []byte("x"), TTY: true}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &appc.PodManifest{}
			base := &appc.App{Exec: []string{"/x"}, Isolators: []appc.Isolator{imgRetain}}
			ra := appc.RuntimeApp{Name: tc.app.Name, App: mergeApp(base, tc.app)}
			err := hostAccess(m, Spec{}, &tc.app, &ra, tc.img)
			if tc.wantErr {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("err %v, want Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var retain []string
			for _, iso := range ra.App.Isolators {
				if iso.Name == isolatorCapsRetain {
					retain = append(retain, string(iso.Value))
				}
			}
			gotCaps := len(retain) == 1 && strings.Contains(retain[0], "CAP_NET_ADMIN") && !strings.Contains(retain[0], "CAP_SYS_MODULE")
			if gotCaps != tc.wantCaps {
				t.Errorf("retain sets %q, want host-privileged %v", retain, tc.wantCaps)
			}
			if len(base.Isolators) != 1 || string(base.Isolators[0].Value) != string(imgRetain.Value) {
				t.Errorf("image's isolators changed: %+v", base.Isolators)
			}
			ann := map[string]string{}
			for _, a := range ra.Annotations {
				ann[a.Name] = a.Value
			}
			if (ann[stagerspec.HostPrivilegedAnnotation] == "true") != tc.wantCaps {
				t.Errorf("annotations %v", ann)
			}
			if got, _ := base64.StdEncoding.DecodeString(ann[stagerspec.StdinAnnotation]); string(got) != tc.wantStdin {
				t.Errorf("stdin %q, want %q", got, tc.wantStdin)
			}
		})
	}
	t.Run("pod annotations", func(t *testing.T) {
		m := &appc.PodManifest{}
		if err := hostAccess(m, Spec{HostIPC: true, HostUTS: true, VolumePropagation: true}, nil, nil, appc.ImageManifest{}); err != nil {
			t.Fatal(err)
		}
		if len(m.Annotations) != 3 || hostShared(Spec{HostIPC: true, HostUTS: true}) == nil {
			t.Errorf("annotations %+v", m.Annotations)
		}
		if len(hostShared(Spec{})) != 0 {
			t.Error("a plain pod shares host namespaces")
		}
	})
}
