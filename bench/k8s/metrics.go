package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// phaseSeries are the histograms of the agent's /metrics that split a
// Kurma ADD under load (internal/kube/cnid/metrics.go,
// internal/agent/metrics.go), printed in this order.
var phaseSeries = []struct{ label, family, match string }{
	{"daemon ADD, whole", "kurma_cni_request_seconds", "command=ADD,result=ok"},
	{"  annotation wait", "kurma_cni_add_phase_seconds", "phase=annotation"},
	{"  network policy wait", "kurma_cni_add_phase_seconds", "phase=policy"},
	{"  attach (agent plug)", "kurma_cni_add_phase_seconds", "phase=attach"},
	{"    port not yet on the feed", "kurma_agent_attach_seconds", "phase=port_wait"},
	{"    urgent port key queue wait", "kurma_agent_queue_wait_seconds", "kind=port,urgent=true"},
	{"    other port keys' queue wait", "kurma_agent_queue_wait_seconds", "kind=port,urgent=false"},
	{"    port sync (plug + report)", "kurma_agent_sync_duration_seconds", "kind=port,result=ok"},
	{"    datapath plug", "kurma_agent_port_plug_duration_seconds", "result=ok"},
	{"  background: vpc syncs", "kurma_agent_sync_duration_seconds", "kind=vpc,result=ok"},
	{"  background: guards syncs", "kurma_agent_sync_duration_seconds", "kind=guards,result=ok"},
	{"  background: lb syncs", "kurma_agent_sync_duration_seconds", "kind=lb,result=ok"},
}

// hist is one histogram series: cumulative counts by upper bound.
type hist struct {
	bounds []float64
	counts []uint64
	count  uint64
	sum    float64
}

// scrape reads the histograms of phaseSeries from a /metrics URL inside
// the cluster's network namespace, by label.
func scrape(ctx context.Context, c *kubecluster.Cluster, url string) (map[string]hist, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	out := map[string]hist{}
	for _, s := range phaseSeries {
		f := fams[s.family]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsOf(m) != s.match || m.GetHistogram() == nil {
				continue
			}
			h := hist{count: m.GetHistogram().GetSampleCount(), sum: m.GetHistogram().GetSampleSum()}
			for _, b := range m.GetHistogram().GetBucket() {
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, b.GetCumulativeCount())
			}
			out[s.label] = h
		}
	}
	return out, nil
}

func labelsOf(m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, l.GetName()+"="+l.GetValue())
	}
	slices.Sort(ls)
	return strings.Join(ls, ",")
}

// minus is h's observations since before (same buckets).
func (h hist) minus(before hist) hist {
	if len(before.counts) != len(h.counts) {
		return h
	}
	d := hist{bounds: h.bounds, count: h.count - before.count, sum: h.sum - before.sum}
	for i := range h.counts {
		d.counts = append(d.counts, h.counts[i]-before.counts[i])
	}
	return d
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket that holds it.
func (h hist) quantile(q float64) float64 {
	if h.count == 0 {
		return math.NaN()
	}
	rank := q * float64(h.count)
	lower, below := 0.0, uint64(0)
	for i, c := range h.counts {
		if float64(c) >= rank {
			if c == below {
				return h.bounds[i]
			}
			return lower + (h.bounds[i]-lower)*(rank-float64(below))/float64(c-below)
		}
		lower, below = h.bounds[i], c
	}
	return lower // in the +Inf bucket: the highest finite bound
}

// printPhases prints, for each phase, the observations made between the
// two scrapes.
func printPhases(before, after map[string]hist) {
	fmt.Println("  agent's own split of those ADDs (from its /metrics; p50/p99 estimated within histogram buckets):")
	for _, s := range phaseSeries {
		h, ok := after[s.label]
		if !ok {
			continue
		}
		h = h.minus(before[s.label])
		if h.count == 0 {
			fmt.Printf("    %-32s none\n", s.label)
			continue
		}
		fmt.Printf("    %-32s n %3d, mean %6.1f ms, p50 %6.1f ms, p99 %6.1f ms\n", s.label, h.count,
			1000*h.sum/float64(h.count), 1000*h.quantile(.5), 1000*h.quantile(.99))
	}
}
