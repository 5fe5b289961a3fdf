// Command cnitimer times a CNI plugin under a real container runtime. It is
// installed in a CNI bin folder under the name of the plugin it wraps; it
// runs <its folder>/.real/<its name> with the same stdin, environment and
// output, and appends one line per call to <its folder>/.timings:
// "COMMAND CONTAINERID START_UNIX_NS DURATION_NS EXIT_CODE". bench/k8s
// reads the lines to report the plugin's ADD latency under load.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

func main() {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cnitimer: %v\n", err)
		os.Exit(1)
	}
	dir, name := filepath.Dir(self), filepath.Base(os.Args[0])
	cmd := exec.Command(filepath.Join(dir, ".real", name), os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	err = cmd.Run()
	dur := time.Since(start)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "cnitimer: %v\n", err)
		code = 1
	}
	line := fmt.Sprintf("%s %s %d %d %d\n", os.Getenv("CNI_COMMAND"), os.Getenv("CNI_CONTAINERID"),
		start.UnixNano(), dur.Nanoseconds(), code)
	if f, err := os.OpenFile(filepath.Join(dir, ".timings"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		_, _ = f.WriteString(line) // one O_APPEND write per call: lines do not interleave
		_ = f.Close()
	}
	os.Exit(code)
}
