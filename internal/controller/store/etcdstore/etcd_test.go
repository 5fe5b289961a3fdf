package etcdstore_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kurma.dev/kurma/internal/controller/etcdtest"
	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/internal/controller/store/etcdstore"
	"kurma.dev/kurma/internal/controller/store/storetest"
	"kurma.dev/kurma/internal/testutil"
)

func TestConformance(t *testing.T) {
	srv := etcdtest.StartT(t)
	storetest.Run(t, func(t *testing.T) (store.Store, store.Store) {
		// A fresh prefix per subtest gives each an empty store.
		prefix := "/" + testutil.UniqueName("kctl") + "/"
		var out [2]store.Store
		for i := range out {
			s, err := etcdstore.Open(t.Context(), etcdstore.Options{Endpoints: []string{srv.ClientURL}, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			out[i] = s
		}
		return out[0], out[1]
	})
}

func TestWatchCompacted(t *testing.T) {
	srv := etcdtest.StartT(t)
	s, err := etcdstore.Open(t.Context(), etcdstore.Options{Endpoints: []string{srv.ClientURL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var revs []int64
	for range 5 {
		r, err := s.Txn(t.Context(), store.Txn{Ops: []store.Op{{Kind: store.OpPut, Key: "x", Value: []byte("v")}}})
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Compact(context.Background(), revs[3], clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Watch(t.Context(), "", revs[0]); !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("watch from compacted revision = %v, want ErrCompacted", err)
	}
}

func TestUnavailable(t *testing.T) {
	srv := etcdtest.StartT(t)
	srv.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 2e9)
	defer cancel()
	_, err := etcdstore.Open(ctx, etcdstore.Options{Endpoints: []string{srv.ClientURL}, DialTimeout: 1e9})
	if err == nil {
		t.Fatal("Open against a stopped etcd succeeded")
	}
}
