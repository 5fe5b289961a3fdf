package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"

	"kurma.dev/kurma/test/cniconformance/mpenv"
)

type ownFunc func(ctx context.Context, n int) (add, del samples, err error)

// setupMizarmp starts the controller and the agent and writes the mizarmp
// network config. It returns the cnitool driver, the own-time measurement
// and a cleanup that is always safe to call.
func setupMizarmp(ctx context.Context, log *slog.Logger, bin, cnitool, tmp string) (*tool, ownFunc, func(), error) {
	noop := func() {}
	for _, b := range []string{"kurma-controller", "kurma-agent", "mizarmp"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, nil, noop, fmt.Errorf("%s not built (make build): %w", b, err)
		}
	}
	suffix := strconv.FormatUint(rand.Uint64()%0xfffff, 16)
	env, err := mpenv.Start(ctx, mpenv.Options{
		ControllerBin: filepath.Join(bin, "kurma-controller"),
		AgentBin:      filepath.Join(bin, "kurma-agent"),
		TmpDir:        tmp,
		Agent:         true,
		HostID:        "kcni-bench-" + suffix,
		LinkPrefix:    "kcb" + suffix[:min(2, len(suffix))],
		NFTTable:      "kcnibench" + suffix,
		Logger:        log,
	})
	if err != nil {
		return nil, nil, noop, err
	}
	dir := filepath.Join(tmp, "mizarmp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		env.Close()
		return nil, nil, noop, err
	}
	conf := env.Conf("1.1.0", "kcnimp")
	if err := os.WriteFile(filepath.Join(dir, "kcnimp.conf"), conf, 0o644); err != nil {
		env.Close()
		return nil, nil, noop, err
	}
	t := &tool{name: "kcnimp", cnitool: cnitool, path: bin, confDir: dir}
	own := func(ctx context.Context, n int) (samples, samples, error) {
		return ownTime(ctx, filepath.Join(bin, "mizarmp"), conf, n)
	}
	return t, own, env.Close, nil
}

// ownTime execs the plugin directly (no cnitool, no libcni), as a runtime
// does, and returns the plugin's own work per ADD and DEL: its run time
// minus the time it waited for the controller (the plugin measures both
// when MIZARMP_TRACE=1). The wall time from exec to exit is printed too.
func ownTime(ctx context.Context, plugin string, conf []byte, n int) (samples, samples, error) {
	var add, del, wallAdd, wallDel, waitAdd, waitDel, cpuAdd, cpuDel samples
	perReq := map[string]samples{} // ADD's requests by kind
	for i := range n {
		ctr, err := testutils.NewNS()
		if err != nil {
			return nil, nil, err
		}
		id := fmt.Sprintf("kcni-own-%d-%d", os.Getpid(), i)
		for _, verb := range []string{"ADD", "DEL"} {
			cmd := exec.CommandContext(ctx, plugin)
			cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + ctr.Path(),
				"CNI_IFNAME=eth0", "CNI_PATH=" + filepath.Dir(plugin), "MIZARMP_TRACE=1"}
			cmd.Stdin = bytes.NewReader(conf)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			start := time.Now()
			err := cmd.Run()
			wall := time.Since(start)
			if err != nil {
				dropNS(ctr)
				return nil, nil, fmt.Errorf("mizarmp %s: %w: %s %s", verb, err, out.Bytes(), errb.Bytes())
			}
			own, err := parseTrace(errb.String(), "own_us=")
			if err != nil {
				return nil, nil, err
			}
			wait, err := parseTrace(errb.String(), "controller_wait_us=")
			if err != nil {
				return nil, nil, err
			}
			cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			if verb == "ADD" {
				for kind, d := range requestTimes(errb.String()) {
					perReq[kind] = append(perReq[kind], d)
				}
			}
			if verb == "ADD" {
				add, wallAdd, waitAdd, cpuAdd = append(add, own), append(wallAdd, wall), append(waitAdd, wait), append(cpuAdd, cpu)
			} else {
				del, wallDel, waitDel, cpuDel = append(del, own), append(wallDel, wall), append(waitDel, wait), append(cpuDel, cpu)
			}
		}
		dropNS(ctr)
	}
	fmt.Printf("  mizarmp direct exec wall time: ADD p50 %s p99 %s   DEL p50 %s p99 %s\n",
		ms(wallAdd.Pct(0.5)), ms(wallAdd.Pct(0.99)), ms(wallDel.Pct(0.5)), ms(wallDel.Pct(0.99)))
	fmt.Printf("  of which waiting for controller+agent:  ADD p50 %s p99 %s   DEL p50 %s p99 %s\n",
		ms(waitAdd.Pct(0.5)), ms(waitAdd.Pct(0.99)), ms(waitDel.Pct(0.5)), ms(waitDel.Pct(0.99)))
	fmt.Printf("  ADD's controller requests p50: POST+WAIT (create, answered once UP) %s  GET+WAIT (fallback long poll) %s  GET subnet (concurrent) %s\n",
		ms(perReq["POST+WAIT"].Pct(0.5)), ms(perReq["GET+WAIT"].Pct(0.5)), ms(perReq["GET"].Pct(0.5)))
	fmt.Printf("  mizarmp CPU time (user+sys, whole process): ADD p50 %s p99 %s   DEL p50 %s p99 %s\n",
		ms(cpuAdd.Pct(0.5)), ms(cpuAdd.Pct(0.99)), ms(cpuDel.Pct(0.5)), ms(cpuDel.Pct(0.99)))
	return add, del, nil
}

func parseTrace(stderr, key string) (time.Duration, error) {
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(l, "mizarmp-trace ") {
			continue
		}
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, key); ok {
				us, err := strconv.Atoi(v)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("no trace line in plugin stderr: %q", stderr)
}

// requestTimes reads the trace's requests=METHOD:µs,... list.
func requestTimes(stderr string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, f := range strings.Fields(stderr) {
		list, ok := strings.CutPrefix(f, "requests=")
		if !ok {
			continue
		}
		for _, r := range strings.Split(list, ",") {
			kind, us, ok := strings.Cut(r, ":")
			if n, err := strconv.Atoi(us); ok && err == nil {
				out[kind] += time.Duration(n) * time.Microsecond
			}
		}
	}
	return out
}
