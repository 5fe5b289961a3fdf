package main

import (
	"strings"
	"testing"
)

func TestParseSlabActive(t *testing.T) {
	const text = `slabinfo - version: 2.1
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>
net_namespace_x      9     63   4224    7    8 : tunables    0    0    0 : slabdata      9      9      0
net_namespace         42     63   4224    7    8 : tunables    0    0    0 : slabdata      9      9      0
`
	for _, tc := range []struct {
		name, text, cache string
		want              int
		err               bool
	}{
		{name: "found", text: text, cache: "net_namespace", want: 42},
		{name: "missing", text: text, cache: "nope", err: true},
		{name: "bad count", text: "net_namespace x 1\n", cache: "net_namespace", err: true},
		{name: "empty", text: "", cache: "net_namespace", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSlabActive(strings.NewReader(tc.text), tc.cache)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("parseSlabActive = %d, %v; want %d (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
}
