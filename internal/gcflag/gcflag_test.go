package gcflag

import (
	"flag"
	"runtime/debug"
	"testing"
)

func TestApply(t *testing.T) {
	t.Cleanup(func() { debug.SetGCPercent(100) })
	tests := []struct {
		name, env string
		args      []string
		want      int
		from      string
		bad       bool
	}{
		{name: "default", want: Default, from: "default"},
		{name: "flag", args: []string{"--gc-percent=50"}, want: 50, from: "flag"},
		{name: "env", env: "80", want: 80, from: "GOGC"},
		{name: "env off", env: "off", want: -1, from: "GOGC"},
		{name: "flag over env", env: "80", args: []string{"--gc-percent=10"}, want: 10, from: "flag"},
		{name: "bad env", env: "x", bad: true},
		{name: "bad flag", args: []string{"--gc-percent=-5"}, bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.env)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			f := Register(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, from, err := f.Apply()
			if tc.bad {
				if err == nil {
					t.Fatalf("got %d from %s, want an error", got, from)
				}
				return
			}
			if err != nil || got != tc.want || from != tc.from {
				t.Fatalf("got %d from %s (%v), want %d from %s", got, from, err, tc.want, tc.from)
			}
			if from != "GOGC" {
				if prev := debug.SetGCPercent(100); prev != tc.want {
					t.Fatalf("runtime GC percent %d, want %d", prev, tc.want)
				}
			}
		})
	}
}
