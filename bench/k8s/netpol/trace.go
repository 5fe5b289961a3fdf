package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// The trace of one change of (b) or (c), to find where its time goes:
// the parent's write, a plain watch of the bench (no informer, no
// handler: when the API server delivers the event to any watcher), the
// policy process's own stamps (its partial sync's debug line: the watch
// event decoded, its handler started, the sync started, computed, in the
// kernel), and the parent's netlink read seeing the element.
type sample struct {
	sent, returned, seen time.Time
	key                  string // kind/name@resourceVersion of the write
}

// stamps records when a plain watch of the bench namespace's pods and
// policies delivers each event, by kind/name@resourceVersion.
type stamps struct {
	mu sync.Mutex
	at map[string]time.Time
}

// watchStamps starts the plain watches (from now on) until ctx ends.
func watchStamps(ctx context.Context, kc kubernetes.Interface) (*stamps, error) {
	s := &stamps{at: map[string]time.Time{}}
	opts := metav1.ListOptions{}
	pw, err := kc.CoreV1().Pods(nsName).Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	nw, err := kc.NetworkingV1().NetworkPolicies(nsName).Watch(ctx, opts)
	if err != nil {
		pw.Stop()
		return nil, err
	}
	for kind, w := range map[string]watch.Interface{"pod": pw, "policy": nw} {
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				now := time.Now()
				m, err := metaOf(ev.Object)
				if err != nil {
					continue
				}
				s.mu.Lock()
				s.at[kind+"/"+m.GetName()+"@"+m.GetResourceVersion()] = now
				s.mu.Unlock()
			}
		}()
	}
	return s, nil
}

func metaOf(o any) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

func (s *stamps) get(key string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[key]
	return t, ok
}

// childSync is one partial sync's debug line of the policy process.
type childSync struct {
	arrived                         time.Time
	queued, handler, compute, apply time.Duration
}

func childSyncs(path string) ([]childSync, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []childSync
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "netpol: partial sync") || !strings.Contains(l, "arrived_us=") {
			continue
		}
		var cs childSync
		var took time.Duration
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			var err error
			switch k {
			case "arrived_us":
				var us int64
				us, err = strconv.ParseInt(v, 10, 64)
				cs.arrived = time.UnixMicro(us)
			case "queued":
				cs.queued, err = time.ParseDuration(v)
			case "handler":
				cs.handler, err = time.ParseDuration(v)
			case "compute":
				cs.compute, err = time.ParseDuration(v)
			case "took":
				took, err = time.ParseDuration(v)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, l, err)
			}
		}
		cs.apply = took - cs.compute
		out = append(out, cs)
	}
	return out, nil
}

// split prints, for the samples of one kind, the median and p99 of each
// step of the change's way: write sent → returned; returned → the plain
// watch's event; returned → the policy process's watch decoded it; its
// informer queue; its handler and wake; compute; apply; and the kernel
// holding the element until the parent's read saw it. A child sync is
// matched to a sample when its event arrived between the write's
// sending and the element's being seen.
func split(label string, ss []sample, st *stamps, cs []childSync) {
	var write, plain, child, queued, handler, compute, apply, read []time.Duration
	matched := 0
	for _, s := range ss {
		write = append(write, s.returned.Sub(s.sent))
		if t, ok := st.get(s.key); ok {
			plain = append(plain, t.Sub(s.returned))
		}
		for _, c := range cs {
			// arrived is rounded to the µs; the window allows for it.
			if c.arrived.Before(s.sent.Add(-time.Microsecond)) || c.arrived.After(s.seen) {
				continue
			}
			matched++
			child = append(child, c.arrived.Sub(s.returned))
			queued = append(queued, c.queued)
			handler = append(handler, c.handler)
			compute = append(compute, c.compute)
			apply = append(apply, c.apply)
			read = append(read, s.seen.Sub(c.arrived.Add(c.queued+c.handler+c.compute+c.apply)))
			break
		}
	}
	p := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "–"
		}
		a, b := pct(ds)
		return fmt.Sprintf("%s / %s", ms(a), ms(b))
	}
	fmt.Printf("| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s |\n", label, matched, len(ss), p(write), p(plain), p(child),
		p(queued), p(handler), p(compute), p(apply), p(read))
}

func splitHeader() {
	fmt.Println("Where a change's time goes, p50 / p99 (each step from the end of the one before, except the two watches, both from the write returned):")
	fmt.Println()
	fmt.Println("| change | traced | write sent → returned | returned → plain watch event | returned → policy process decoded it | informer queue | handler + wake | compute | apply | kernel → parent's read |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
}
