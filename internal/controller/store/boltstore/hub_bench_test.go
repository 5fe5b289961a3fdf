package boltstore

import (
	"testing"

	"kurma.dev/kurma/internal/controller/store"
)

// BenchmarkHubPublish measures publishing one port-sized event at a time
// into the default 65536-event history (the writer's path per commit).
func BenchmarkHubPublish(b *testing.B) {
	h := newHub(0, 1<<16)
	val := make([]byte, 900)
	b.ReportAllocs()
	for i := range b.N {
		h.publish([]store.Event{{Type: store.EventPut, Key: "ports/p/x", Value: val, Rev: int64(i + 1)}}, int64(i+1))
	}
}
