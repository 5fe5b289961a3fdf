// Command netattach measures what the network manager adds to attaching a
// pod: the median time of manager.Attach + Detach (rendering the interface
// name, the per-pod lock, the plugin call through the HostCaller to
// kurma-netplugin's /opt/network/add and del, result parsing and the
// Pod.Networks record) against the same CNI plugins called directly by the
// pinned cnitool on the same bridge + host-local config, in the same run,
// interleaved. The goal is at most 5 ms added per pod. Everything runs in
// network namespaces this program creates (one standing in for the host,
// one for the pod) and removes.
//
// -mode pod (podmode.go) measures kurmad's default path, through the
// networking pod, against cnitool in the same run; -mode both runs both.
//
// Needs root and `make build` (bin/kurma-netplugin, bin/cni, bin/tools).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/internal/pod/stageinit"

	"kurma.dev/kurma/bench/internal/benchutil"
)

func main() {
	// The pod manager of -mode pod re-executes this binary as stage-init.
	if len(os.Args) > 1 && os.Args[1] == stageinit.Arg {
		os.Exit(stageinit.Main(os.Args[2:]))
	}
	iters := flag.Int("n", 60, "attach+detach cycles per path")
	mode := flag.String("mode", "both", "host (HostCaller vs cnitool in a stand-in netns), pod (networking pod vs cnitool) or both")
	flag.Parse()
	var err error
	if *mode == "host" || *mode == "both" {
		err = run(*iters)
	}
	if err == nil && (*mode == "pod" || *mode == "both") {
		err = runPod(*iters, binDir())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/netattach:", err)
		os.Exit(1)
	}
}

func binDir() string {
	bin := os.Getenv("KURMA_BIN_DIR")
	if bin == "" {
		bin = "bin"
	}
	bin, _ = filepath.Abs(bin)
	return bin
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func run(iters int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root")
	}
	bin := os.Getenv("KURMA_BIN_DIR")
	if bin == "" {
		bin = "bin"
	}
	bin, _ = filepath.Abs(bin)
	plugin := filepath.Join(bin, "kurma-netplugin")
	cnitool := filepath.Join(bin, "tools", "cnitool")
	cniDir := filepath.Join(bin, "cni")
	for _, p := range []string{plugin, cnitool, filepath.Join(cniDir, "bridge"), filepath.Join(cniDir, "host-local")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing: run `make build`", p)
		}
	}
	work, err := os.MkdirTemp("", "knm-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	plugDir := filepath.Join(work, "plugin")
	if err := os.MkdirAll(plugDir, 0o755); err != nil {
		return err
	}
	for _, n := range []string{"add", "del"} {
		if err := os.Symlink(plugin, filepath.Join(plugDir, n)); err != nil {
			return err
		}
	}
	host, removeHost, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer removeHost()
	podNS, removePodNS, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer removePodNS()

	netName := unique("knmbench")
	entry := map[string]any{
		"cniVersion": "1.0.0", "name": netName, "type": "bridge", "bridge": unique("knmb"),
		"isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.179.7.0/24", "dataDir": filepath.Join(work, "ipam")},
	}
	conf, _ := json.Marshal(entry)
	entry["aci"], entry["default"], entry["containerInterface"] = "file:///unused.aci", true, "eth0"
	raw, _ := json.Marshal(entry)
	nw, err := netconf.ParseEntry(raw)
	if err != nil {
		return err
	}
	confDir := filepath.Join(work, "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-bench.conf"), conf, 0o644); err != nil {
		return err
	}
	m, err := manager.New(manager.Options{Networks: []netconf.Network{nw},
		Caller: &manager.HostCaller{Dirs: map[string]string{netName: plugDir},
			Env: []string{"KURMA_CNI_PATH=" + cniDir, "KURMA_NETWORK_STATE_DIR=" + filepath.Join(work, "state")}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	p := &pod.Pod{UUID: "146d7cef-fbf6-41da-a2f8-eba218597f9c", NetNS: podNS.Path()}
	ctx := context.Background()

	ours := func() (time.Duration, error) {
		var d time.Duration
		err := host.Do(func(ns.NetNS) error {
			start := time.Now()
			nets, err := m.Attach(ctx, p)
			if err != nil {
				return err
			}
			p.Networks = nets
			err = m.Detach(ctx, p)
			d = time.Since(start)
			return err
		})
		return d, err
	}
	env := append(os.Environ(), "CNI_PATH="+cniDir, "NETCONFPATH="+confDir)
	tool := func(args ...string) error {
		cmd := exec.Command(cnitool, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("cnitool %v: %v\n%s", args, err, out.String())
		}
		return nil
	}
	direct := func() (time.Duration, error) {
		var d time.Duration
		err := host.Do(func(ns.NetNS) error {
			start := time.Now()
			if err := tool("add", netName, podNS.Path()); err != nil {
				return err
			}
			err := tool("del", netName, podNS.Path())
			d = time.Since(start)
			return err
		})
		return d, err
	}
	for range 3 {
		if _, err := ours(); err != nil {
			return err
		}
		if _, err := direct(); err != nil {
			return err
		}
	}
	var o, c []time.Duration
	for i := range iters {
		a, b := ours, direct
		if i%2 == 1 {
			a, b = direct, ours
		}
		da, err := a()
		if err != nil {
			return err
		}
		db, err := b()
		if err != nil {
			return err
		}
		if i%2 == 1 {
			da, db = db, da
		}
		o, c = append(o, da), append(c, db)
	}
	om, cm := benchutil.Median(o), benchutil.Median(c)
	fmt.Printf("netattach: attach+detach of one pod to a bridge+host-local network, %d cycles each (medians)\n", iters)
	fmt.Printf("  network manager (Attach+Detach via kurma-netplugin): %7.2f ms\n", benchutil.Ms(om))
	fmt.Printf("  cnitool add+del (peer):                              %7.2f ms\n", benchutil.Ms(cm))
	fmt.Printf("  added per pod: %.2f ms (goal <= 5 ms); ratio manager/cnitool = %.3f\n", benchutil.Ms(om-cm), float64(om)/float64(cm))
	fmt.Printf("  fastest: manager %.2f ms, cnitool %.2f ms, difference %.2f ms\n",
		benchutil.Ms(slices.Min(o)), benchutil.Ms(slices.Min(c)), benchutil.Ms(slices.Min(o)-slices.Min(c)))
	return nil
}
