package cnid

import (
	"errors"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestParseArgs(t *testing.T) {
	full := PodArgs{Namespace: "default", Name: "web-1", InfraContainerID: "abc", UID: "u-1"}
	for _, tc := range []struct {
		name, in string
		want     PodArgs
		bad      bool
	}{
		{"containerd order", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1", full, false},
		{"other order", "K8S_POD_UID=u-1;K8S_POD_NAME=web-1;IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_NAMESPACE=default", full, false},
		{"unknown ignored", "IgnoreUnknown=true;FOO=bar;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1", PodArgs{Namespace: "default", Name: "web-1"}, false},
		{"unknown refused", "FOO=bar;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1", PodArgs{}, true},
		{"no name", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default", PodArgs{}, true},
		{"empty", "", PodArgs{}, true},
		{"not kv", "IgnoreUnknown=1;oops;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", PodArgs{}, true},
		{"dup", "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_NAME=c", PodArgs{}, true},
		{"slash", "K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=b", PodArgs{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.in)
			if tc.bad {
				if !errors.Is(err, kerrors.Invalid) {
					t.Fatalf("ParseArgs(%q) = %+v, %v; want Invalid", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseArgs(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func FuzzParseArgs(f *testing.F) {
	f.Add("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1")
	f.Add("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;=c")
	f.Add(";;")
	f.Fuzz(func(t *testing.T, in string) {
		a, err := ParseArgs(in)
		if err == nil && (a.Namespace == "" || a.Name == "") {
			t.Fatalf("accepted %q without namespace or name", in)
		}
	})
}
