package gcflag

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
)

// Default is the --gc-percent default: a collection once the heap has
// grown by a tenth over what the last one left live.
const Default = 10

// Flag is a registered --gc-percent.
type Flag struct {
	fs *flag.FlagSet
	v  *int
}

// Register adds --gc-percent to fs.
func Register(fs *flag.FlagSet) *Flag {
	return &Flag{fs: fs, v: fs.Int("gc-percent", Default,
		"Go GC target: collect when the heap has grown this many percent over the live heap "+
			"(GOGC; Go's own default is 100; lower: less peak memory, more GC CPU; -1: off). "+
			"Given, it wins over $GOGC; not given, $GOGC wins over the default")}
}

// Apply sets the GC target (after fs is parsed) and returns the value in
// force and where it came from ("flag", "GOGC" or "default").
func (f *Flag) Apply() (int, string, error) {
	given := false
	f.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == "gc-percent" })
	v, from := *f.v, "flag"
	if !given {
		from = "default"
		if env := os.Getenv("GOGC"); env != "" {
			// The runtime has applied it already; report it.
			if env == "off" {
				return -1, "GOGC", nil
			}
			n, err := strconv.Atoi(env)
			if err != nil {
				return 0, "", fmt.Errorf("GOGC=%q: want a number or off", env)
			}
			return n, "GOGC", nil
		}
	}
	if v < -1 {
		return 0, "", fmt.Errorf("--gc-percent %d: want -1 (off) or more", v)
	}
	debug.SetGCPercent(v)
	return v, from, nil
}
