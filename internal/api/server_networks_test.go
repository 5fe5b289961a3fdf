package api

import (
	"context"
	"os"
	"path/filepath"
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
			srv, err := NewServer(Options{Pods: newFakeManager(), Images: &fakeStore{}, Networks: c.lister})
			if err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(t.TempDir(), "k.sock")
			l, err := Listen(sock, -1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx, l) }()
			cl := NewClient(sock)
			t.Cleanup(func() {
				cl.Close()
				cancel()
				<-done
				_ = os.Remove(sock)
			})
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
