package api_test

import (
	"errors"
	"sync"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// TestSubnetDeleteRacesPortCreate: creating ports while the subnet is being
// deleted either fails cleanly or leaves the subnet in place; a deleted
// subnet never has ports left on it.
func TestSubnetDeleteRacesPortCreate(t *testing.T) {
	for round := range 5 {
		e := newEnv(t, "10.60.0.0/24")
		ctx := t.Context()
		// Make the subnet deletable only once the creators are done: one
		// port that we delete ourselves first.
		var wg sync.WaitGroup
		created := make(chan string, 1000)
		for range 4 {
			wg.Go(func() {
				for range 15 {
					p, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"})
					if err != nil {
						if !errors.Is(err, kerrors.NotFound) && !errors.Is(err, kerrors.Unavailable) {
							t.Errorf("create: %v", err)
						}
						return
					}
					created <- p.ID
				}
			})
		}
		deleted := false
		for range 30 {
			err := e.cli.DeleteSubnet(ctx, "p1", "s1")
			if err == nil {
				deleted = true
				break
			}
			if !errors.Is(err, kerrors.Conflict) {
				t.Fatalf("round %d: delete subnet: %v", round, err)
			}
			// Free what exists so the delete can win at some point.
			for _, p := range listAll(t, e) {
				if err := e.cli.DeletePort(ctx, "p1", p.ID); err != nil && !errors.Is(err, kerrors.NotFound) {
					t.Fatalf("delete port: %v", err)
				}
			}
		}
		wg.Wait()
		close(created)
		ports := listAll(t, e)
		if deleted && len(ports) != 0 {
			t.Fatalf("round %d: subnet deleted but %d ports remain on it", round, len(ports))
		}
		if !deleted {
			// Subnet survived: it must still accept ports (no stuck mark).
			for _, p := range ports {
				_ = e.cli.DeletePort(ctx, "p1", p.ID)
			}
			if _, err := e.cli.CreatePort(ctx, "p1", capi.Port{NetworkID: "s1"}); err != nil {
				t.Fatalf("round %d: surviving subnet refuses ports: %v", round, err)
			}
		}
	}
}
