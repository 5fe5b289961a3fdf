package ctrl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"kurma.dev/kurma/internal/kube/leader"
	"kurma.dev/kurma/pkg/kerrors"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder records the results of syncs; each result is also sent on
// done, so tests wait on it instead of sleeping.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	done  chan string
	fail  map[string]int // key -> failures left
}

func newRecorder() *recorder {
	return &recorder{calls: map[string]int{}, fail: map[string]int{}, done: make(chan string, 100)}
}

func (r *recorder) sync(_ context.Context, key string) error {
	r.mu.Lock()
	r.calls[key]++
	fail := r.fail[key] > 0
	if fail {
		r.fail[key]--
	}
	r.mu.Unlock()
	defer func() { r.done <- key }()
	if fail {
		return errors.New("injected")
	}
	return nil
}

func (r *recorder) wait(t *testing.T, key string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case k := <-r.done:
			if k == key {
				return
			}
		case <-timeout:
			t.Fatalf("no sync of %q within 20s", key)
		}
	}
}

// gather reads reg: gauges by name, histograms' counts by
// name{label values}, and whether the last-success time is set.
func gather(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			if h := m.GetHistogram(); h != nil {
				var vals []string
				for _, l := range m.GetLabel() {
					vals = append(vals, l.GetValue())
				}
				out[name+"{"+strings.Join(vals, ",")+"}"] = fmt.Sprint(h.GetSampleCount())
				continue
			}
			v := m.GetGauge().GetValue()
			out[name] = fmt.Sprint(v)
			if strings.HasPrefix(name, "t_last_success") {
				out[name+">0"] = fmt.Sprint(v > 0)
			}
		}
	}
	return out
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

func run(t *testing.T, c *Controller) (cancel func(), done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, fin := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(fin)
		ch <- c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-fin
	})
	return cancel, ch
}

func TestNewInvalid(t *testing.T) {
	sync := func(context.Context, string) error { return nil }
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no name", Config{Sync: sync}},
		{"no sync", Config{Name: "x"}},
		{"lease without client", Config{Name: "x", Sync: sync, Lease: &leader.Lease{Namespace: "a", Name: "b", Identity: "c"}}},
		{"lease without identity", Config{Name: "x", Sync: sync, Kube: fake.NewClientset(), Lease: &leader.Lease{Namespace: "a", Name: "b"}}},
		{"metrics without prefix", Config{Name: "x", Sync: sync, Metrics: prometheus.NewRegistry()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

// TestRunSetupSyncRetry: Setup is retried until it succeeds, the workers
// then sync the keys queued (a failed one again, with backoff), and Status
// and the metrics say so.
func TestRunSetupSyncRetry(t *testing.T) {
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	inf := coreinformers.NewNodeInformer(kube, 0, cache.Indexers{})
	rec := newRecorder()
	rec.fail["k1"] = 2
	var setups int
	setupDone := make(chan struct{})
	reg := prometheus.NewRegistry()
	var c *Controller
	c, err := New(Config{Name: "t", Informers: []cache.SharedInformer{inf}, Sync: rec.sync, Workers: 2,
		Setup: func(ctx context.Context) error {
			setups++
			if setups < 3 {
				return kerrors.New(kerrors.Unavailable, "controller down")
			}
			if !inf.HasSynced() {
				t.Error("setup before the informer synced")
			}
			c.Queue().Add("k1")
			close(setupDone)
			return nil
		},
		Metrics: reg, MetricsPrefix: "t", KindOf: func(k string) string { return k[:1] }, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Health(); err == nil || !strings.Contains(err.Error(), "not synced") {
		t.Fatalf("health before Run: %v", err)
	}
	run(t, c)
	<-setupDone
	rec.wait(t, "k1")
	rec.wait(t, "k1")
	rec.wait(t, "k1")
	// The recorder reports a sync as it returns; the controller records
	// the success (metric, then time) after that.
	deadline := time.Now().Add(20 * time.Second)
	for c.Status().LastSuccess.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("no successful sync recorded within 20s")
		}
		time.Sleep(time.Millisecond)
	}
	s := c.Status()
	if !s.Synced || !s.Leading || !s.SetUp || s.LastSuccess.IsZero() || c.Health() != nil {
		t.Fatalf("status %v, health %v", s, c.Health())
	}
	if setups != 3 {
		t.Fatalf("setup ran %d times, want 3", setups)
	}
	got := gather(t, reg)
	for name, want := range map[string]string{
		"t_leader":                           "1",
		"t_sync_duration_seconds{k,error}":   "2",
		"t_sync_duration_seconds{k,ok}":      "1",
		"t_queue_depth":                      "0",
		"t_last_success_timestamp_seconds>0": "true",
	} {
		if got[name] != want {
			t.Errorf("metric %s = %q, want %q (all: %v)", name, got[name], want, got)
		}
	}
	if !strings.Contains(s.String(), "setup=true") {
		t.Fatalf("status line %q", s)
	}
}

// TestSetupPermanent: a setup refused as Invalid ends Run with the error,
// and no key is synced.
func TestSetupPermanent(t *testing.T) {
	rec := newRecorder()
	c, err := New(Config{Name: "t", Sync: rec.sync, Logger: quiet,
		Setup: func(context.Context) error { return kerrors.New(kerrors.Invalid, "bad project") }})
	if err != nil {
		t.Fatal(err)
	}
	c.Queue().Add("k")
	_, done := run(t, c)
	select {
	case err := <-done:
		if !errors.Is(err, kerrors.Invalid) {
			t.Fatalf("Run: %v, want Invalid", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not end")
	}
	if rec.count() != 0 {
		t.Fatalf("synced %v after a failed setup", rec.calls)
	}
}

// TestNoSyncAfterLeadershipEnds: a key taken from the queue once the
// leadership's context has ended is dropped, not synced.
func TestNoSyncAfterLeadershipEnds(t *testing.T) {
	rec := newRecorder()
	c, err := New(Config{Name: "t", Sync: rec.sync, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Queue().Add("k")
	k, _ := c.Queue().Get()
	c.process(ctx, k)
	if rec.count() != 0 || c.Queue().Len() != 0 || c.Queue().NumRequeues("k") != 0 {
		t.Fatalf("calls %v, depth %d", rec.calls, c.Queue().Len())
	}
}

// TestResyncKey: the resync key is queued every period.
func TestResyncKey(t *testing.T) {
	rec := newRecorder()
	c, err := New(Config{Name: "t", Sync: rec.sync, ResyncKey: "resync", Resync: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	rec.wait(t, "resync")
	rec.wait(t, "resync")
}

// TestLeaseStandby: with a Lease held by another replica, a synced
// standby is healthy and syncs nothing.
func TestLeaseStandby(t *testing.T) {
	kube := fake.NewClientset()
	lease := func(id string) *leader.Lease {
		return &leader.Lease{Namespace: "kube-system", Name: "t", Identity: id,
			Duration: time.Second, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}
	}
	recA, recB := newRecorder(), newRecorder()
	a, err := New(Config{Name: "t", Kube: kube, Lease: lease("a"), Sync: recA.sync, Logger: quiet,
		ResyncKey: "r", Resync: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, a)
	recA.wait(t, "r") // a leads
	b, err := New(Config{Name: "t", Kube: kube, Lease: lease("b"), Sync: recB.sync, Logger: quiet,
		ResyncKey: "r", Resync: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, b)
	deadline := time.Now().Add(20 * time.Second)
	for b.Health() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("standby not healthy: %v", b.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// a keeps leading through several of b's retry periods.
	for range 10 {
		recA.wait(t, "r")
	}
	if s := b.Status(); s.Leading || recB.count() != 0 {
		t.Fatalf("standby status %v, synced %v", s, recB.calls)
	}
}

// levelLog collects the levels and messages of the records logged.
type levelLog struct {
	mu   sync.Mutex
	recs []string
}

func (l *levelLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Level.String()+" "+r.Message)
	return nil
}
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelLog) WithGroup(string) slog.Handler      { return l }

func (l *levelLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.recs
	l.recs = nil
	return out
}

// TestWaitingLoggedAtDebug: a key whose sync keeps failing with
// ErrWaiting is retried, logged at debug level until it has waited
// WaitWarn and as a warning after; another failure is a warning at once,
// and a success or another failure starts the wait over.
func TestWaitingLoggedAtDebug(t *testing.T) {
	type step struct {
		err     error
		advance time.Duration // the clock moves before the sync
		want    string        // the record logged, "" for none
	}
	wait := fmt.Errorf("namespace a: subnet ns-1 still has ports: %w", ErrWaiting)
	other := errors.New("controller down")
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"waiting, then over the bound", []step{
			{wait, 0, "DEBUG t: sync waiting; retrying"},
			{wait, 4 * time.Minute, "DEBUG t: sync waiting; retrying"},
			{wait, 59 * time.Second, "DEBUG t: sync waiting; retrying"},
			{wait, time.Second, "WARN t: sync failed; retrying"},
			{wait, time.Minute, "WARN t: sync failed; retrying"},
			{nil, 0, ""},
		}},
		{"a success starts the wait over", []step{
			{wait, 0, "DEBUG t: sync waiting; retrying"},
			{wait, 4 * time.Minute, "DEBUG t: sync waiting; retrying"},
			{nil, 0, ""},
			{wait, 4 * time.Minute, "DEBUG t: sync waiting; retrying"},
			{wait, 4 * time.Minute, "DEBUG t: sync waiting; retrying"},
		}},
		{"other failures warn at once", []step{
			{other, 0, "WARN t: sync failed; retrying"},
			{wait, 0, "DEBUG t: sync waiting; retrying"},
			{other, 10 * time.Minute, "WARN t: sync failed; retrying"},
			{wait, time.Minute, "DEBUG t: sync waiting; retrying"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &levelLog{}
			var next error
			c, err := New(Config{Name: "t", Logger: slog.New(log), Sync: func(context.Context, string) error { return next }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.q.ShutDown)
			clock := time.Unix(1e9, 0)
			c.now = func() time.Time { return clock }
			for i, s := range tc.steps {
				clock = clock.Add(s.advance)
				next = s.err
				c.q.Forget("k") // the retry's backoff: the test does not wait for it
				c.q.Add("k")
				k, _ := c.q.Get()
				c.process(t.Context(), k)
				var want []string
				if s.want != "" {
					want = []string{s.want}
				}
				if got := log.take(); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("step %d (%v after %v): logged %q, want %q", i, s.err, s.advance, got, want)
				}
			}
			c.waitMu.Lock()
			_, left := c.waitingSince["k"]
			c.waitMu.Unlock()
			if want := tc.steps[len(tc.steps)-1].err == wait; left != want {
				t.Fatalf("k recorded as waiting: %t, want %t", left, want)
			}
		})
	}
}
