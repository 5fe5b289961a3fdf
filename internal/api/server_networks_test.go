package api

import (
	"context"
	"reflect"
	"testing"
)

type fixedNetworks []NetworkInfo

func (f fixedNetworks) ListNetworks(context.Context) []NetworkInfo { return f }

func TestListNetworks(t *testing.T) {
	want := fixedNetworks{
		{Name: "kurma", Image: "file:///x.aci", Default: true, State: "running"},
		{Name: "b", Image: "docker://b", State: "failed", Error: "plugin main executable exited with status 1", Restarts: 2},
	}
	cases := []struct {
		name   string
		lister NetworkLister
		want   []NetworkInfo
	}{
		{"none configured", nil, []NetworkInfo{}},
		{"two", want, want},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl, _, _ := serve(t, Options{Pods: newFakeManager(), Images: &fakeStore{}, Networks: c.lister})
			got, err := cl.ListNetworks(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
