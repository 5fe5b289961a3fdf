package nice

import (
	"runtime"
	"sync"
	"testing"
)

// TestSet raises the nice value of the test process by one (allowed to
// anyone) and finds it on every thread, including threads made after.
func TestSet(t *testing.T) {
	before, err := Of()
	if err != nil {
		t.Fatal(err)
	}
	cur := -100
	for _, v := range before {
		cur = max(cur, v)
	}
	want := min(cur+1, 19)
	if err := Set(want); err != nil {
		t.Fatal(err)
	}
	// New OS threads: goroutines locked to their threads while others run.
	var wg sync.WaitGroup
	hold := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			runtime.LockOSThread()
			<-hold
		})
	}
	after, err := Of()
	close(hold)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for tid, v := range after {
		if v != want {
			t.Errorf("thread %d: nice %d, want %d", tid, v, want)
		}
	}
	for _, bad := range []int{-21, 20} {
		if err := Set(bad); err == nil {
			t.Errorf("Set(%d) succeeded", bad)
		}
	}
}
