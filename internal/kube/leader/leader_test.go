package leader

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func fastLease(id string) Lease {
	return Lease{Namespace: "kube-system", Name: "test", Identity: id,
		Duration: time.Second, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}
}

// slowLead leads until its context ends, then takes a while to stop (as
// workers finishing their current sync do), and records that it stopped.
func slowLead(started chan<- struct{}, stopped *atomic.Bool) func(context.Context) error {
	return func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // the workers' stop
		stopped.Store(true)
		return nil
	}
}

// TestLostLeaseWaitsForLead: a leader whose renewals fail loses the lease;
// Run returns ErrLost only once lead has stopped.
func TestLostLeaseWaitsForLead(t *testing.T) {
	kube := fake.NewClientset()
	var failing atomic.Bool
	kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("renewal refused")
		}
		return false, nil, nil
	})
	started := make(chan struct{})
	var stopped atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), kube, fastLease("a"), "t", quiet, slowLead(started, &stopped))
	}()
	<-started
	failing.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("Run: %v, want ErrLost", err)
		}
		if !stopped.Load() {
			t.Fatal("Run returned while lead was still running")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("lease not lost within 20s")
	}
}

// TestCancelReleasesAfterLead: on cancellation the lease is released only
// after lead has stopped, then another replica leads.
func TestCancelReleasesAfterLead(t *testing.T) {
	kube := fake.NewClientset()
	var releasedEarly atomic.Bool
	var stopped atomic.Bool
	kube.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l, ok := a.(k8stesting.UpdateAction).GetObject().(*coordv1.Lease)
		if ok && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") && !stopped.Load() {
			releasedEarly.Store(true)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- Run(ctx, kube, fastLease("a"), "t", quiet, slowLead(started, &stopped)) }()
	<-started
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if !stopped.Load() || releasedEarly.Load() {
		t.Fatalf("lead stopped %v, lease released before: %v", stopped.Load(), releasedEarly.Load())
	}
	// The next replica leads at once (the lease was released).
	b := make(chan struct{})
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	err := Run(ctx2, kube, fastLease("b"), "t", quiet, func(context.Context) error { close(b); return nil })
	if err != nil {
		t.Fatalf("second replica: %v", err)
	}
	select {
	case <-b:
	default:
		t.Fatal("second replica never led")
	}
}

// TestFollowerCancel: a replica that never led returns nil on cancellation.
func TestFollowerCancel(t *testing.T) {
	kube := fake.NewClientset()
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	started := make(chan struct{})
	var stopped atomic.Bool
	go func() { _ = Run(ctxA, kube, fastLease("a"), "t", quiet, slowLead(started, &stopped)) }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, kube, fastLease("b"), "t", quiet, func(context.Context) error {
			t.Error("follower led")
			return nil
		})
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("follower Run: %v", err)
	}
}
