package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"kurma.dev/kurma/bench/internal/benchutil"
	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/internal/network/manager"
	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
)

// runPod measures kurmad's default path: manager.Attach + Detach through
// the networking pod (a real pod manager, stager and kurma-netplugin
// image; each call is nsenter + /opt/stager/run + a fork in the plugin
// container + add/del), against cnitool add+del on the same config in the
// same (host) network namespace, interleaved. The networking pod shares
// the host's network namespace, so the bridge is made on the host (a
// unique knpb* name, deleted at the end; no traffic is sent). It also
// reports the floor of one call: a del for an unknown pod through the
// run call-in against the same binary run directly.
func runPod(iters int, bin string) (retErr error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, p := range []string{"images/kurma-stager.aci", "images/kurma-netplugin.aci", "keys/stager.pub", "tools/cnitool"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			return fmt.Errorf("%s missing: run `make build`", p)
		}
	}
	work, err := os.MkdirTemp("", "knp-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	kr, err := trust.LoadKeyring(filepath.Join(bin, "keys", "stager.pub"))
	if err != nil {
		return err
	}
	store, err := image.Open(ctx, filepath.Join(work, "images"), image.Options{Keyring: kr, Logger: quiet})
	if err != nil {
		return err
	}
	netnsDir := filepath.Join(work, "netns")
	if err := manager.PrepareNetNSDir(netnsDir); err != nil {
		return err
	}
	defer func() { _ = manager.ReleaseNetNSDir(netnsDir) }()

	netName, bridge := unique("knpbench"), unique("knpb")
	defer func() { _ = exec.Command("ip", "link", "del", bridge).Run() }()
	// The cnitool peer runs the same config on the host, so host-local
	// keeps its allocations under the host's PluginStateDir: remove what
	// this run added there.
	_, statErr := os.Stat(netconf.PluginStateDir)
	defer func() {
		if os.IsNotExist(statErr) {
			_ = os.RemoveAll(netconf.PluginStateDir)
			return
		}
		_ = os.RemoveAll(filepath.Join(netconf.PluginStateDir, "ipam", netName))
	}()
	entry := map[string]any{
		"cniVersion": "1.0.0", "name": netName, "type": "bridge", "bridge": bridge,
		"isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.179.8.0/24", "dataDir": netconf.PluginStateDir + "/ipam"},
	}
	entry["aci"], entry["default"], entry["containerInterface"] = "file://"+filepath.Join(bin, "images", "kurma-netplugin.aci"), true, "eth0"
	raw, _ := json.Marshal(entry)
	nw, err := netconf.ParseEntry(raw)
	if err != nil {
		return err
	}
	caller := &manager.PodCaller{Pod: manager.DefaultNetPodName, Apps: manager.AppNames([]netconf.Network{nw})}
	m, err := manager.New(manager.Options{Networks: []netconf.Network{nw}, Caller: caller,
		InitialState: manager.Starting, NetNSDir: netnsDir, Logger: quiet})
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	rt, err := pod.New(ctx, pod.Options{PodsDir: filepath.Join(work, "pods"), VolumesDir: filepath.Join(work, "volumes"),
		Images: store, StagerImage: "file://" + filepath.Join(bin, "images", "kurma-stager.aci"),
		Executable: exe, Network: m, Logger: quiet})
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())
	caller.Pods = rt
	sup, err := manager.NewSupervisor(manager.SupervisorOptions{Pods: rt, Manager: m, NetNSDir: netnsDir,
		StateDir: filepath.Join(work, "network"), Logger: quiet})
	if err != nil {
		return err
	}
	supCtx, supCancel := context.WithCancel(ctx)
	supDone := make(chan struct{})
	go func() { defer close(supDone); _ = sup.Run(supCtx) }()
	defer func() {
		supCancel()
		<-supDone
		sup.Stop(context.Background())
	}()
	t0 := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	m.WaitSettled(wctx)
	wcancel()
	if st := m.List(ctx)[0]; st.State != manager.Running {
		return fmt.Errorf("networking pod: %s %s", st.State, st.Error)
	}
	fmt.Printf("networking pod up in %.0f ms\n", benchutil.Ms(time.Since(t0)))

	podNS, removePodNS, err := benchutil.NewNS()
	if err != nil {
		return err
	}
	defer removePodNS()
	p := &pod.Pod{UUID: "7b0e4c55-5d0b-4a59-9d0e-4f3f3b0f1c2a", NetNS: podNS.Path()}

	// cnitool on the same config (host-local store in work/ipam).
	direct := map[string]any{}
	for k, v := range entry {
		direct[k] = v
	}
	delete(direct, "aci")
	delete(direct, "default")
	delete(direct, "containerInterface")
	direct["ipam"] = map[string]any{"type": "host-local", "subnet": "10.179.8.0/24", "dataDir": filepath.Join(work, "ipam")}
	conf, _ := json.Marshal(direct)
	confDir := filepath.Join(work, "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-bench.conf"), conf, 0o644); err != nil {
		return err
	}
	env := append(os.Environ(), "CNI_PATH="+filepath.Join(bin, "cni"), "NETCONFPATH="+confDir)
	tool := func(args ...string) error {
		cmd := exec.Command(filepath.Join(bin, "tools", "cnitool"), args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("cnitool %v: %v\n%s", args, err, out)
		}
		return nil
	}
	viaPod := func() (time.Duration, error) {
		start := time.Now()
		nets, err := m.Attach(ctx, p)
		if err != nil {
			return 0, err
		}
		p.Networks = nets
		err = m.Detach(ctx, p)
		return time.Since(start), err
	}
	viaTool := func() (time.Duration, error) {
		start := time.Now()
		if err := tool("add", netName, podNS.Path()); err != nil {
			return 0, err
		}
		err := tool("del", netName, podNS.Path())
		return time.Since(start), err
	}
	// The floor of one call: del of an unknown pod, through the call-in
	// and directly.
	delArgs := []string{filepath.Join(netnsDir, "none"), "knp-unknown", "eth0"}
	floorPod := func() (time.Duration, error) {
		start := time.Now()
		o, err := caller.Call(ctx, netName, manager.VerbDel, delArgs, nw.Config)
		if err == nil && o.Code != 0 {
			err = fmt.Errorf("del exited %d: %s", o.Code, o.Stderr)
		}
		return time.Since(start), err
	}
	floorHost := func() (time.Duration, error) {
		start := time.Now()
		cmd := exec.Command(filepath.Join(bin, "kurma-netplugin"), append([]string{"del"}, delArgs...)...)
		cmd.Env = []string{"KURMA_CNI_PATH=" + filepath.Join(bin, "cni"), "KURMA_NETWORK_STATE_DIR=" + filepath.Join(work, "floor")}
		cmd.Stdin = bytesReader(nw.Config)
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("del: %v: %s", err, out)
		}
		return time.Since(start), err
	}
	callin := &manager.PodCaller{Pods: rt, Pod: caller.Pod, Apps: caller.Apps, NoDirect: true}
	floorCallIn := func() (time.Duration, error) {
		start := time.Now()
		o, err := callin.Call(ctx, netName, manager.VerbDel, delArgs, nw.Config)
		if err == nil && o.Code != 0 {
			err = fmt.Errorf("del exited %d: %s", o.Code, o.Stderr)
		}
		return time.Since(start), err
	}
	paths := []func() (time.Duration, error){viaPod, viaTool, floorPod, floorHost, floorCallIn}
	res := make([][]time.Duration, len(paths))
	for i := range 3 + iters {
		for j := range paths {
			k := (i + j) % len(paths) // rotate the order
			d, err := paths[k]()
			if err != nil {
				return err
			}
			if i >= 3 {
				res[k] = append(res[k], d)
			}
		}
	}
	pm, cm := benchutil.Median(res[0]), benchutil.Median(res[1])
	fp, fh := benchutil.Median(res[2]), benchutil.Median(res[3])
	fmt.Printf("netattach (pod mode): attach+detach through the networking pod, %d cycles each (medians)\n", iters)
	fmt.Printf("  network manager via networking pod (Attach+Detach): %7.2f ms\n", benchutil.Ms(pm))
	fmt.Printf("  cnitool add+del (peer, same config, host netns):    %7.2f ms\n", benchutil.Ms(cm))
	fmt.Printf("  added per pod: %.2f ms (goal <= 5 ms); ratio = %.3f\n", benchutil.Ms(pm-cm), float64(pm)/float64(cm))
	fmt.Printf("  fastest: pod %.2f ms, cnitool %.2f ms\n", benchutil.Ms(slices.Min(res[0])), benchutil.Ms(slices.Min(res[1])))
	fc := benchutil.Median(res[4])
	fmt.Printf("  one call's floor (del of an unknown pod), medians:\n")
	fmt.Printf("    host process (no pod):                         %7.2f ms\n", benchutil.Ms(fh))
	fmt.Printf("    init socket (PodCaller default, stager.RunAt): %7.2f ms (+%.2f)\n", benchutil.Ms(fp), benchutil.Ms(fp-fh))
	fmt.Printf("    nsenter + /opt/stager/run call-in:             %7.2f ms (+%.2f)\n", benchutil.Ms(fc), benchutil.Ms(fc-fh))
	return nil
}
