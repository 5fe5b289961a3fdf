// Command netplugin measures what Kurma's default network plugin adds to a
// pod attachment: the median time of `add` + `del` through our binary
// (cmd/kurma-netplugin, as /opt/network/add and /opt/network/del) against
// the same CNI plugins called directly by the pinned cnitool, on the same
// bridge + host-local config in the same run. The goal is at most 5 ms added
// per pod. Everything happens inside network namespaces this program
// creates (one standing in for the host, one for the pod) and removes.
//
// Needs root and `make build` (bin/kurma-netplugin, bin/cni, bin/tools).
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/bench/internal/benchutil"
)

func main() {
	iters := flag.Int("n", 40, "add+del cycles per tool")
	flag.Parse()
	if err := run(*iters); err != nil {
		fmt.Fprintln(os.Stderr, "bench/netplugin:", err)
		os.Exit(1)
	}
}

func unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// timing holds wall times per call and, per add+del cycle, the CPU time
// (user+sys of the process and the plugins it waited for), which a loaded
// shared machine disturbs much less than wall time.
type timing struct{ add, del, cpu []time.Duration }

func run(iters int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root")
	}
	bin := benchutil.BinDir()
	plugin := filepath.Join(bin, "kurma-netplugin")
	cnitool := filepath.Join(bin, "tools", "cnitool")
	cniDir, _ := filepath.Abs(filepath.Join(bin, "cni"))
	for _, p := range []string{plugin, cnitool, filepath.Join(cniDir, "bridge"), filepath.Join(cniDir, "host-local")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing: run `make build`", p)
		}
	}
	work, err := os.MkdirTemp("", "knet-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	for _, n := range []string{"add", "del"} {
		if err := os.Symlink(filepath.Join(mustAbs(plugin)), filepath.Join(work, n)); err != nil {
			return err
		}
	}

	host, removeHost, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer removeHost()
	pod, removePod, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer removePod()

	netName := unique("knetbench")
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": netName, "type": "bridge", "bridge": unique("knetb"),
		"isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.251.7.0/24", "dataDir": filepath.Join(work, "ipam")},
	})
	confDir := filepath.Join(work, "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-bench.conf"), conf, 0o644); err != nil {
		return err
	}
	env := append(os.Environ(), "KURMA_CNI_PATH="+cniDir, "KURMA_NETWORK_STATE_DIR="+filepath.Join(work, "state"),
		"CNI_PATH="+cniDir, "NETCONFPATH="+confDir)

	var lastCPU time.Duration
	call := func(stdin []byte, name string, args ...string) (time.Duration, error) {
		var d time.Duration
		err := host.Do(func(ns.NetNS) error {
			cmd := exec.Command(name, args...)
			cmd.Env = env
			cmd.Stdin = bytes.NewReader(stdin)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			d = time.Since(start)
			if cmd.ProcessState != nil {
				lastCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			if err != nil {
				return fmt.Errorf("%s %v: %v\n%s", filepath.Base(name), args, err, out.String())
			}
			return nil
		})
		return d, err
	}
	podID := "146d7cef-fbf6-41da-a2f8-eba218597f9c"
	ours := func(t *timing) error {
		a, err := call(conf, filepath.Join(work, "add"), pod.Path(), podID, "eth0")
		if err != nil {
			return err
		}
		cpu := lastCPU
		d, err := call(conf, filepath.Join(work, "del"), pod.Path(), podID, "eth0")
		if err != nil {
			return err
		}
		t.add, t.del, t.cpu = append(t.add, a), append(t.del, d), append(t.cpu, cpu+lastCPU)
		return nil
	}
	direct := func(t *timing) error {
		a, err := call(nil, cnitool, "add", netName, pod.Path())
		if err != nil {
			return err
		}
		cpu := lastCPU
		d, err := call(nil, cnitool, "del", netName, pod.Path())
		if err != nil {
			return err
		}
		t.add, t.del, t.cpu = append(t.add, a), append(t.del, d), append(t.cpu, cpu+lastCPU)
		return nil
	}
	var warm, o, c timing
	for range 3 { // warm caches, create the bridge
		if err := ours(&warm); err != nil {
			return err
		}
		if err := direct(&warm); err != nil {
			return err
		}
	}
	for i := range iters { // interleave so both see the same machine load
		first, second := ours, direct
		ft, st := &o, &c
		if i%2 == 1 {
			first, second, ft, st = direct, ours, &c, &o
		}
		if err := first(ft); err != nil {
			return err
		}
		if err := second(st); err != nil {
			return err
		}
	}
	oa, od, ca, cd := benchutil.Median(o.add), benchutil.Median(o.del), benchutil.Median(c.add), benchutil.Median(c.del)
	ot, ct := benchutil.Median(sum(o)), benchutil.Median(sum(c))
	fmt.Printf("netplugin add+del, bridge+host-local, %d cycles each (medians)\n", iters)
	fmt.Printf("  kurma-netplugin: add %7.2f ms  del %7.2f ms  add+del %7.2f ms\n", benchutil.Ms(oa), benchutil.Ms(od), benchutil.Ms(ot))
	fmt.Printf("  cnitool (peer):  add %7.2f ms  del %7.2f ms  add+del %7.2f ms\n", benchutil.Ms(ca), benchutil.Ms(cd), benchutil.Ms(ct))
	fmt.Printf("  added overhead per pod: %.2f ms (goal <= 5 ms); ratio ours/cnitool = %.3f\n", benchutil.Ms(ot-ct), float64(ot)/float64(ct))
	// Minimums are less sensitive to other load on a shared machine.
	om, cm := slices.Min(sum(o)), slices.Min(sum(c))
	fmt.Printf("  fastest add+del: kurma-netplugin %.2f ms, cnitool %.2f ms, difference %.2f ms\n", benchutil.Ms(om), benchutil.Ms(cm), benchutil.Ms(om-cm))
	oc, cc := benchutil.Median(o.cpu), benchutil.Median(c.cpu)
	fmt.Printf("  CPU per add+del (user+sys incl. plugins): kurma-netplugin %.2f ms, cnitool %.2f ms, added %.2f ms\n", benchutil.Ms(oc), benchutil.Ms(cc), benchutil.Ms(oc-cc))
	return nil
}

func sum(t timing) []time.Duration {
	out := make([]time.Duration, len(t.add))
	for i := range t.add {
		out[i] = t.add[i] + t.del[i]
	}
	return out
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}
