package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ErrLost ends Run when another replica took the lease while this one led.
var ErrLost = errors.New("lost the leader lease")

// Lease names the Lease object and the timings of the election.
type Lease struct {
	Namespace, Name string
	// Identity names this replica (default: the hostname).
	Identity string
	// Duration, RenewDeadline and RetryPeriod are client-go's; defaults
	// 12s, 8s and 2s, so a dead leader is replaced within ~14s.
	Duration, RenewDeadline, RetryPeriod time.Duration
}

// Run campaigns for the lease named name and, once elected, runs lead
// until it returns or ctx ends. It returns lead's error, ErrLost (wrapped
// with name) when the lease was lost while ctx was still live, and nil on
// cancellation. The lease is released when Run returns.
func Run(ctx context.Context, kube kubernetes.Interface, l Lease, name string, log *slog.Logger, lead func(context.Context) error) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.Identity},
	}
	var leadErr error
	lost := false
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: l.Duration, RenewDeadline: l.RenewDeadline, RetryPeriod: l.RetryPeriod,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info(name+": leading", "identity", l.Identity)
				leadErr = lead(ctx)
				cancel()
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					lost = true
				}
				cancel()
			},
		},
	})
	if err != nil {
		return fmt.Errorf("%s: leader election: %w", name, err)
	}
	le.Run(lctx)
	switch {
	case leadErr != nil:
		return leadErr
	case lost:
		return fmt.Errorf("%s: %w", name, ErrLost)
	}
	return nil
}
