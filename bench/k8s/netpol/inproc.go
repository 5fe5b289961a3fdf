package main

import (
	"context"
	"fmt"
	"os/exec"
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
		step := func(cs, as *[]time.Duration) error {
			t0 := time.Now()
			ch := e.Compute()
			t1 := time.Now()
			if err := pp.Apply(ctx, conv(ch)); err != nil {
				return err
			}
			*cs, *as = append(*cs, t1.Sub(t0)), append(*as, time.Since(t1))
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
			t0 := time.Now()
			e.SetPod(&moved)
			ch = append(ch, time.Since(t0))
			if err := step(&cc, &ca); err != nil {
				return err
			}
			t0 = time.Now()
			e.SetPod(pods[i])
			ch = append(ch, time.Since(t0))
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
	}
	return nil
}
