package benchutil

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAgentNice: AgentNice is the install manifest's --nice for the
// agent.
func TestAgentNice(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/kubernetes/30-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("- --nice=%d\n", AgentNice); !strings.Contains(string(b), want) {
		t.Fatalf("30-agent.yaml has no %q: AgentNice (%d) is not the deployed agent's", want, AgentNice)
	}
}

func TestStats(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name             string
		in               []time.Duration
		median, p50, p99 time.Duration
	}{
		{"empty", nil, 0, 0, 0},
		{"one", ms(7), 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond},
		{"odd unsorted", ms(9, 1, 5), 5 * time.Millisecond, 5 * time.Millisecond, 9 * time.Millisecond},
		{"even averages", ms(4, 1, 3, 2), 2500 * time.Microsecond, 2 * time.Millisecond, 4 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := append([]time.Duration(nil), tt.in...)
			if got := Median(tt.in); got != tt.median {
				t.Errorf("Median = %v, want %v", got, tt.median)
			}
			if got := Samples(tt.in).Pct(0.5); got != tt.p50 {
				t.Errorf("p50 = %v, want %v", got, tt.p50)
			}
			if got := Samples(tt.in).Pct(0.99); got != tt.p99 {
				t.Errorf("p99 = %v, want %v", got, tt.p99)
			}
			for i := range orig {
				if tt.in[i] != orig[i] {
					t.Fatal("samples were reordered")
				}
			}
		})
	}
}
