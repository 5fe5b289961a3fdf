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
	// Identity names this replica; required (Run applies no default:
	// kurma-k8s-watcher takes --identity, else $POD_NAME, else the
	// hostname).
	Identity string
	// Duration, RenewDeadline and RetryPeriod are client-go's; Run uses
	// 12s, 8s and 2s for those left zero, so a dead leader is replaced
	// within ~14s.
	Duration, RenewDeadline, RetryPeriod time.Duration
}

// withDefaults fills the zero timings.
func (l Lease) withDefaults() Lease {
	if l.Duration <= 0 {
		l.Duration = 12 * time.Second
	}
	if l.RenewDeadline <= 0 {
		l.RenewDeadline = 8 * time.Second
	}
	if l.RetryPeriod <= 0 {
		l.RetryPeriod = 2 * time.Second
	}
	return l
}

// Run campaigns for the lease named name and, once elected, runs lead
// until it returns, the lease is lost or ctx ends. It returns lead's
// error, ErrLost (wrapped with name) when the lease was lost while ctx was
// still live, and nil on cancellation.
//
// Run returns only after lead has returned: the leader's workers have
// stopped before the caller goes on (and, say, campaigns again). On
// cancellation the lease is released only after that, so another replica
// never leads while this one's workers still write. (A lease lost to a
// failed renewal cannot wait: another replica may take it once it
// expires, Duration after the last renewal, which RenewDeadline leaves
// lead to stop in.)
func Run(ctx context.Context, kube kubernetes.Interface, l Lease, name string, log *slog.Logger, lead func(context.Context) error) error {
	l = l.withDefaults()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.Identity},
	}
	// The election's context outlives ctx until lead has returned: its
	// end releases the lease (ReleaseOnCancel).
	ectx, endElection := context.WithCancel(context.WithoutCancel(ctx))
	defer endElection()
	elected := make(chan context.Context, 1) // the leadership's context, once
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: l.Duration, RenewDeadline: l.RenewDeadline, RetryPeriod: l.RetryPeriod,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) { elected <- lctx },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("%s: leader election: %w", name, err)
	}
	campaign := make(chan struct{})
	go func() {
		defer close(campaign)
		le.Run(ectx)
	}()
	// lead runs on this goroutine, so Run returns only after it has.
	var lctx context.Context
	select {
	case <-ctx.Done():
		endElection()
		<-campaign
		return nil
	case <-campaign: // only when ectx ends, which only Run does
		return nil
	case lctx = <-elected:
	}
	log.Info(name+": leading", "identity", l.Identity)
	wctx, cancel := context.WithCancel(lctx)
	stop := context.AfterFunc(ctx, cancel)
	err = lead(wctx)
	self := wctx.Err() == nil
	stop()
	cancel()
	endElection() // releases the lease if still held
	<-campaign
	switch {
	case self:
		return err
	case ctx.Err() == nil:
		return fmt.Errorf("%s: %w", name, ErrLost)
	}
	return nil // cancelled
}
