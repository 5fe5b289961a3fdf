package netpol

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestSelCache: a cached selector says what a freshly compiled one says,
// selectors that differ only in how their strings split get different
// entries, and an invalid selector fails every time.
func TestSelCache(t *testing.T) {
	var c selCache
	ex := func(op metav1.LabelSelectorOperator, vals ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: op, Values: vals}}}
	}
	for _, tc := range []struct {
		name string
		sel  *metav1.LabelSelector
		set  map[string]string
		want bool
		err  bool
	}{
		{"empty selects all", &metav1.LabelSelector{}, map[string]string{"a": "b"}, true, false},
		{"labels", &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}, map[string]string{"a": "b"}, true, false},
		{"labels, other value", &metav1.LabelSelector{MatchLabels: map[string]string{"a": "bc"}}, map[string]string{"a": "b"}, false, false},
		{"labels split differently", &metav1.LabelSelector{MatchLabels: map[string]string{"ab": "c"}}, map[string]string{"a": "b"}, false, false},
		{"in, two values", ex(metav1.LabelSelectorOpIn, "x", "y"), map[string]string{"k": "y"}, true, false},
		{"in, one value", ex(metav1.LabelSelectorOpIn, "xy"), map[string]string{"k": "y"}, false, false},
		{"notin", ex(metav1.LabelSelectorOpNotIn, "x", "y"), map[string]string{"k": "y"}, false, false},
		{"invalid", ex(metav1.LabelSelectorOpIn), nil, false, true},
		{"invalid again", ex(metav1.LabelSelectorOpIn), nil, false, true},
	} {
		for round := range 2 { // compiled, then from the cache
			s, err := c.selector(tc.sel)
			if (err != nil) != tc.err {
				t.Fatalf("%s (round %d): err %v, want error %v", tc.name, round, err, tc.err)
			}
			if err == nil && s.Matches(labels.Set(tc.set)) != tc.want {
				t.Errorf("%s (round %d): matches %v, want %v", tc.name, round, !tc.want, tc.want)
			}
		}
	}
}
