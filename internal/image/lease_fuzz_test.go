package image

import (
	"testing"

	"kurma.dev/kurma/pkg/appc"
)

// FuzzParseLease: a lease file is read back from disk; whatever it holds,
// parsing must not panic and must yield only valid image IDs.
func FuzzParseLease(f *testing.F) {
	f.Add([]byte(`["sha512-0123456789abcdef0123456789abcdef"]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`["../../etc/passwd"]`))
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := parseLease(b)
		if err != nil {
			return
		}
		for _, id := range ids {
			if !appc.ValidImageID(id) {
				t.Fatalf("invalid ID %q accepted from %q", id, b)
			}
		}
	})
}
