package agent

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQueueDedupAndExclusive(t *testing.T) {
	q := newQueue(time.Millisecond, 10*time.Millisecond)
	defer q.Shutdown()
	for _, k := range []string{"a", "b", "a", "a"} {
		q.Add(k)
	}
	if q.Len() != 2 {
		t.Fatalf("len %d, want 2", q.Len())
	}
	k, _ := q.Get()
	if k != "a" {
		t.Fatalf("got %q", k)
	}
	q.Add("a") // while processing: not handed out twice
	k2, _ := q.Get()
	if k2 != "b" || q.Len() != 0 {
		t.Fatalf("got %q, len %d", k2, q.Len())
	}
	q.Done("a")
	if q.Len() != 1 {
		t.Fatalf("a re-added during processing was not requeued on Done")
	}
	q.Done("b")
}

func TestQueueBackoff(t *testing.T) {
	q := newQueue(30*time.Millisecond, 120*time.Millisecond)
	defer q.Shutdown()
	for i, want := range []time.Duration{30, 60, 120, 120} {
		t.Run(want.String(), func(t *testing.T) {
			if got := q.Retry("a"); got != want*time.Millisecond {
				t.Fatalf("retry %d: delay %v, want %v", i, got, want*time.Millisecond)
			}
		})
	}
	q.Forget("a")
	if got := q.Retry("a"); got != 30*time.Millisecond {
		t.Fatalf("after Forget: %v", got)
	}
	start := time.Now()
	if k, ok := q.Get(); !ok || k != "a" {
		t.Fatalf("Get = %q, %v", k, ok)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("retry handed out after %v, before its delay", el)
	}
	q.Done("a")
}

func TestQueueShutdownWakesWorkers(t *testing.T) {
	q := newQueue(time.Millisecond, time.Millisecond)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok := q.Get(); ok {
				t.Error("Get after shutdown returned a key")
			}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	q.Shutdown()
	wg.Wait()
}

func TestQueueAddAfter(t *testing.T) {
	q := newQueue(time.Millisecond, 10*time.Millisecond)
	defer q.Shutdown()
	start := time.Now()
	q.AddAfter("a", 80*time.Millisecond)
	q.AddAfter("a", time.Millisecond) // the earlier timer stays
	if q.Len() != 0 {
		t.Fatalf("len %d before the delay", q.Len())
	}
	k, ok := q.Get()
	if !ok || k != "a" {
		t.Fatalf("got %q %v", k, ok)
	}
	if d := time.Since(start); d < 80*time.Millisecond {
		t.Fatalf("handed out after %v, want >= 80ms", d)
	}
	q.Done("a")
	if q.Len() != 0 {
		t.Fatalf("delayed add counted twice: len %d", q.Len())
	}
}

func TestQueueUrgent(t *testing.T) {
	q := newQueue(time.Millisecond, 10*time.Millisecond)
	defer q.Shutdown()
	for _, k := range []string{"a", "b", "c"} {
		q.Add(k)
	}
	q.AddUrgent("c") // waiting: moves ahead
	q.AddUrgent("d") // new: ahead of a and b, behind c
	q.Add("d")       // already queued: stays urgent
	if q.Len() != 4 {
		t.Fatalf("len %d, want 4", q.Len())
	}
	var got []string
	for range 2 {
		k, _ := q.Get()
		got = append(got, k)
	}
	// c is being processed; made urgent again, it comes back before b
	// after Done.
	q.AddUrgent("c")
	k, _ := q.Get()
	got = append(got, k)
	q.Done("c")
	for q.Len() > 0 {
		k, _ := q.Get()
		got = append(got, k)
	}
	if want := "c d a c b"; strings.Join(got, " ") != want {
		t.Fatalf("order %v, want %s", got, want)
	}
	if _, waited, _, _ := func() (string, time.Duration, bool, bool) { q.Add("e"); return q.GetWaited() }(); waited < 0 || waited > time.Second {
		t.Fatalf("waited %v", waited)
	}
}

// TestQueueUrgentWorker: a worker that takes only urgent keys gets each
// urgent key and never a plain one; a plain worker never gets an urgent
// one.
func TestQueueUrgentWorker(t *testing.T) {
	q := newQueue(time.Millisecond, 10*time.Millisecond)
	defer q.Shutdown()
	got := make(chan string, 4)
	go func() {
		for {
			k, _, ok := q.GetUrgent()
			if !ok {
				return
			}
			got <- k
			q.Done(k)
		}
	}()
	q.Add("plain")
	q.Add("moved")
	q.AddUrgent("moved") // waiting as plain: moves to the urgent line
	q.AddUrgent("new")
	for _, want := range []string{"moved", "new"} {
		select {
		case k := <-got:
			if k != want {
				t.Fatalf("urgent worker got %q, want %q", k, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("urgent worker never got %q", want)
		}
	}
	select {
	case k := <-got:
		t.Fatalf("urgent worker got %q", k)
	case <-time.After(50 * time.Millisecond):
	}
	// A plain worker leaves urgent keys alone.
	q.AddUrgent("later")
	if k, _, ok := q.GetPlain(); k != "plain" || !ok {
		t.Fatalf("plain worker got %q", k)
	}
	select {
	case k := <-got:
		if k != "later" {
			t.Fatalf("urgent worker got %q", k)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("urgent worker never got later")
	}
}

// TestQueueUrgentQueued: a key is in the urgent line from AddUrgent until
// a worker takes it, and again when it is made urgent while processed.
func TestQueueUrgentQueued(t *testing.T) {
	q := newQueue(time.Millisecond, 10*time.Millisecond)
	defer q.Shutdown()
	check := func(step string, want bool) {
		t.Helper()
		if got := q.UrgentQueued("k"); got != want {
			t.Fatalf("%s: urgent queued %t, want %t", step, got, want)
		}
	}
	check("never added", false)
	q.Add("k")
	check("added plain", false)
	q.AddUrgent("k")
	check("made urgent", true)
	if k, _, ok := q.GetUrgent(); !ok || k != "k" {
		t.Fatalf("got %q", k)
	}
	check("taken", false)
	q.AddUrgent("k")
	check("urgent again while processed", true)
	q.Done("k")
	check("handed out again", true)
}
