// Package benchutil holds what the benchmarks under bench/ share: where the
// built binaries are, percentiles of duration samples, milliseconds, and
// throwaway network namespaces, and one nftables element read back.
//
// Only the main packages under bench/ import it; it imports nothing from
// Kurma.
package benchutil

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// AgentNice is kurma-agent's --nice in the install manifest
// (deploy/kubernetes/30-agent.yaml; TestAgentNice checks): the benchmarks
// run the agent, or what of it they measure, at the deployed CPU
// priority.
const AgentNice = -10

// BinDir is where `make build` put the binaries: $KURMA_BIN_DIR, else "bin"
// (benchmarks run from the repository root).
func BinDir() string {
	if d := os.Getenv("KURMA_BIN_DIR"); d != "" {
		return d
	}
	return "bin"
}

// Samples is a set of measured durations.
type Samples []time.Duration

// Pct returns the nearest-rank p-quantile (p in (0, 1]; 0.99 is p99), or 0
// for no samples. The samples are not reordered.
func (s Samples) Pct(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(math.Ceil(p*float64(len(c)))) - 1
	return c[max(0, min(i, len(c)-1))]
}

// Slowest formats the n largest samples in milliseconds, largest first
// (a p99 of 20 samples is their maximum: one slow sample sets it, and
// the next ones say whether it stood alone).
func (s Samples) Slowest(n int) string {
	c := slices.Clone(s)
	slices.Sort(c)
	slices.Reverse(c)
	parts := make([]string, 0, n)
	for _, d := range c[:min(n, len(c))] {
		parts = append(parts, fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)))
	}
	return strings.Join(parts, ", ") + " ms"
}

// Median is the middle sample, or the mean of the two middle ones for an
// even count; 0 for no samples. The samples are not reordered.
func Median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Ms is d in milliseconds, for printing with %.2f.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
