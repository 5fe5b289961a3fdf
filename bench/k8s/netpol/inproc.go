package main

import (
	"context"
	"fmt"
	"os/exec"
	"runtime/metrics"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"k8s.io/apimachinery/pkg/util/intstr"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/agent/policypath"
	"kurma.dev/kurma/internal/kube/netpol"
)

// inProcess splits a change's time in the policy process without the API
// server and informers (-inprocess): the same engine and policy path as
// the child, fed directly, programming a table in a network namespace of
// its own. For each N, (b) one policy created and deleted and (c) one
// remote pod relabelled and back, each timed as engine Compute, then the
// path's Apply (conversion, walk, one netlink transaction), p50/p99.
func inProcess(ctx context.Context, sizes []int, adds, local int) error {
	n, remove, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer remove()
	fmt.Println("| policies | (b) compute p50 / p99 | (b) apply p50 / p99 | (c) SetPod p50 / p99 | (c) compute p50 / p99 | (c) apply p50 / p99 | (a) first Compute | (a) Sync | resync, nothing changed |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, size := range sizes {
		// Each size starts from an empty table.
		_ = n.Do(func(ns.NetNS) error { return exec.Command("nft", "delete", "table", "inet", table).Run() })
		pp, err := policypath.New(ctx, policypath.Config{HostNS: n.Path(), Table: table})
		if err != nil {
			return err
		}
		e := netpol.NewEngine(node)
		e.SetNamespace(nsName, nil)
		pods := make([]*netpol.Pod, nPods)
		for i := range nPods {
			nd := "remote"
			if i < local {
				nd = node
			}
			pods[i] = &netpol.Pod{Namespace: nsName, Name: fmt.Sprintf("p%d", i), Node: nd, IP: podIP(i),
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%apps), "grp": fmt.Sprintf("g-%d", i%groups)}}
			e.SetPod(pods[i])
		}
		for j := range size {
			np := policy(j)
			np.Namespace = nsName
			if err := e.SetPolicy(np); err != nil {
				return err
			}
		}
		t0 := time.Now()
		e.Compute()
		first := time.Since(t0)
		t0 = time.Now()
		if err := pp.Sync(ctx, conv(e.All())); err != nil {
			return err
		}
		sync := time.Since(t0)
		// A resync of the same state (the periodic full sync, or a restart
		// finding its elements in place).
		t0 = time.Now()
		if err := pp.Sync(ctx, conv(e.All())); err != nil {
			return err
		}
		resync := time.Since(t0)
		var bc, ba, cc, ca, ch []time.Duration // ch: the peer's SetPod (the handler's engine work)
		var trace []stepTrace                  // (c)'s samples, in order
		var handler time.Duration              // the last SetPod's
		var mark gcMark
		step := func(cs, as *[]time.Duration) error {
			t0 := time.Now()
			ch := e.Compute()
			t1 := time.Now()
			if err := pp.Apply(ctx, conv(ch)); err != nil {
				return err
			}
			*cs, *as = append(*cs, t1.Sub(t0)), append(*as, time.Since(t1))
			if cs == &cc {
				ops, commit := pp.LastCommit()
				gcs, alloc := mark.since()
				trace = append(trace, stepTrace{n: len(trace), handler: handler, compute: t1.Sub(t0), apply: time.Since(t1),
					commit: commit, ops: ops, st: e.LastStats(), gcs: gcs, alloc: alloc})
			}
			return nil
		}
		for k := range adds {
			np := policy(0)
			np.Namespace, np.Name = nsName, fmt.Sprintf("probe-%d", k)
			np.Spec.Ingress[0].Ports[0].Port = new(intstr.FromInt32(int32(20000 + k)))
			if err := e.SetPolicy(np); err != nil {
				return err
			}
			if err := step(&bc, &ba); err != nil {
				return err
			}
			e.DeletePolicy(nsName, np.Name)
			if err := step(&bc, &ba); err != nil {
				return err
			}
			i := local + 1 + groups*k
			moved := *pods[i]
			moved.Labels = map[string]string{"app": pods[i].Labels["app"], "grp": "g-0"}
			mark.start()
			t0 := time.Now()
			e.SetPod(&moved)
			handler = time.Since(t0)
			ch = append(ch, handler)
			if err := step(&cc, &ca); err != nil {
				return err
			}
			mark.start()
			t0 = time.Now()
			e.SetPod(pods[i])
			handler = time.Since(t0)
			ch = append(ch, handler)
			if err := step(&cc, &ca); err != nil {
				return err
			}
		}
		_ = pp.Close()
		b50, b99 := pct(bc)
		a50, a99 := pct(ba)
		c50, c99 := pct(cc)
		d50, d99 := pct(ca)
		h50, h99 := pct(ch)
		fmt.Printf("| %d | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %s |\n", size, ms(b50), ms(b99), ms(a50), ms(a99),
			ms(h50), ms(h99), ms(c50), ms(c99), ms(d50), ms(d99), ms(first), ms(sync), ms(resync))
		slowest(size, trace)
	}
	return nil
}

// stepTrace is one sample of (c) in the policy process's stages.
type stepTrace struct {
	n                               int // its place in (c)'s order
	handler, compute, apply, commit time.Duration
	ops                             int
	st                              netpol.Stats
	gcs                             uint64 // GC cycles that ended in the sample
	alloc                           uint64 // bytes allocated in the sample
}

func (t stepTrace) total() time.Duration { return t.handler + t.compute + t.apply }

// slowest prints (c)'s slowest samples with what each stage did, and the
// allocation per change.
func slowest(size int, ts []stepTrace) {
	if len(ts) == 0 {
		return
	}
	var allocs []uint64
	var gcs uint64
	for _, t := range ts {
		allocs = append(allocs, t.alloc)
		gcs += t.gcs
	}
	slices.Sort(allocs)
	fmt.Printf("\nN=%d (c): %d samples, GC cycles ended in them %d, bytes allocated per change p50 %d, max %d\n", size, len(ts), gcs,
		allocs[len(allocs)/2], allocs[len(allocs)-1])
	fmt.Println("| # | total | SetPod | compute (weights built, recomputed, patched, changed) | walk | commit (ops) | GC cycles | allocated |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b stepTrace) int { return int(b.total() - a.total()) })
	for _, t := range ts[:min(8, len(ts))] {
		fmt.Printf("| %d | %s | %s | %s (%d, %d, %d, %d) | %s | %s (%d) | %d | %d KB |\n", t.n, ms(t.total()), ms(t.handler), ms(t.compute),
			t.st.WeightsBuilt, t.st.Recomputed, t.st.Patched, t.st.Changed, ms(t.apply-t.commit), ms(t.commit), t.ops, t.gcs, t.alloc>>10)
	}
}

// gcMark reads the runtime's GC cycle and allocation counters.
type gcMark struct {
	s  [2]metrics.Sample
	at [2]uint64 // at start
}

func (m *gcMark) read() (uint64, uint64) {
	m.s[0].Name, m.s[1].Name = "/gc/cycles/total:gc-cycles", "/gc/heap/allocs:bytes"
	metrics.Read(m.s[:])
	return m.s[0].Value.Uint64(), m.s[1].Value.Uint64()
}

func (m *gcMark) start() { m.at[0], m.at[1] = m.read() }

// since returns the GC cycles ended and bytes allocated since start.
func (m *gcMark) since() (uint64, uint64) {
	g, a := m.read()
	return g - m.at[0], a - m.at[1]
}
