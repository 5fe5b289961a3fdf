package cnid

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"kurma.dev/kurma/internal/agent"
	"kurma.dev/kurma/internal/kube/cniwire"
	"kurma.dev/kurma/internal/kube/podnet"
	"kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// versions are the CNI versions the driver speaks.
var versions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

func cniError(code uint, msg, details string) *types.Error {
	return &types.Error{Code: code, Msg: msg, Details: details}
}

// errorResponse is the CNI error JSON (in the config's version) and exit
// status 1.
func errorResponse(cniVersion string, e *types.Error) cniwire.Response {
	if !slices.Contains(versions, cniVersion) {
		cniVersion = "1.1.0"
	}
	b, _ := json.Marshal(struct {
		CNIVersion string `json:"cniVersion"`
		*types.Error
	}{cniVersion, e})
	return cniwire.Response{ExitCode: 1, Stdout: append(b, '\n')}
}

// Handle runs one CNI invocation.
func (d *Daemon) Handle(ctx context.Context, req *cniwire.Request) cniwire.Response {
	return d.handle(ctx, req, time.Now(), 0)
}

// addTrace is where one ADD spent its time in the daemon, logged with
// its outcome (one line per ADD; bench/k8s joins it with the runtime's
// side by container id).
type addTrace struct {
	annotation, policy, attach time.Duration
	pod, port                  string
}

// handle runs one CNI invocation read from a connection accepted at
// accepted, while inflight requests (this one included) were served.
func (d *Daemon) handle(ctx context.Context, req *cniwire.Request, accepted time.Time, inflight int) cniwire.Response {
	var conf types.NetConf
	cmd := req.Env["CNI_COMMAND"]
	if cmd == "VERSION" {
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "supportedVersions": versions})
		return cniwire.Response{Stdout: append(b, '\n')}
	}
	if err := json.Unmarshal(req.Stdin, &conf); err != nil {
		return errorResponse("", cniError(types.ErrDecodingFailure, "decode network config", err.Error()))
	}
	if !slices.Contains(versions, conf.CNIVersion) {
		return errorResponse("", cniError(types.ErrIncompatibleCNIVersion, "incompatible CNI version",
			fmt.Sprintf("config has %q; kurma-k8s speaks %v", conf.CNIVersion, versions)))
	}
	start := time.Now()
	var tr addTrace
	out, err := d.verb(ctx, cmd, req.Env, &conf, req.Stdin, &tr)
	d.m.observeRequest(cmd, start, err)
	if cmd == "ADD" && err == nil {
		d.log.Info("cnid: ADD", "container", req.Env["CNI_CONTAINERID"], "pod", tr.pod, "port", tr.port,
			"read", start.Sub(accepted), "annotation", tr.annotation, "policy", tr.policy, "attach", tr.attach,
			"took", time.Since(start), "inflight", inflight)
	} else {
		d.log.Debug("cnid: request", "cmd", cmd, "container", req.Env["CNI_CONTAINERID"], "took", time.Since(start), "err", err)
	}
	if err != nil {
		var te *types.Error
		if !errors.As(err, &te) {
			te = cniError(types.ErrInternal, err.Error(), "")
		}
		if cmd == "ADD" || cmd == "DEL" {
			d.log.Warn("cnid: request failed", "cmd", cmd, "args", req.Env["CNI_ARGS"], "code", te.Code, "msg", te.Msg, "details", te.Details)
		}
		return errorResponse(conf.CNIVersion, te)
	}
	return cniwire.Response{Stdout: out}
}

func (d *Daemon) verb(ctx context.Context, cmd string, env map[string]string, conf *types.NetConf, stdin []byte, tr *addTrace) ([]byte, error) {
	switch cmd {
	case "STATUS":
		return nil, d.status()
	case "GC":
		return nil, d.gc(ctx, conf)
	case "ADD", "DEL", "CHECK":
	default:
		return nil, cniError(types.ErrInvalidEnvironmentVariables, "CNI_COMMAND "+cmd+" is not supported", "")
	}
	cid, ifname, netnsPath := env["CNI_CONTAINERID"], env["CNI_IFNAME"], env["CNI_NETNS"]
	if err := validContainerID(cid); err != nil {
		return nil, cniError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if ifname == "" || len(ifname) > 15 || strings.ContainsAny(ifname, "/: \t\n") || ifname == "." || ifname == ".." {
		return nil, cniError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_IFNAME %q is not an interface name", ifname), "")
	}
	if cmd == "DEL" {
		return nil, d.del(ctx, cid+"_"+ifname)
	}
	if !strings.HasPrefix(netnsPath, "/") {
		return nil, cniError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q: want an absolute path", netnsPath), "")
	}
	args, err := ParseArgs(env["CNI_ARGS"])
	if err != nil {
		return nil, cniError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if cmd == "CHECK" {
		return nil, d.check(ctx, cid, ifname, netnsPath, args)
	}
	return d.add(ctx, conf, cid, ifname, netnsPath, args, tr)
}

// annotationOf returns the pod's default network when its annotation is
// there, made for this pod and bound to this host; otherwise why not.
func (d *Daemon) annotationOf(p *corev1.Pod) (podnet.Network, *types.Error) {
	v, ok := p.Annotations[podnet.Annotation]
	if !ok {
		return podnet.Network{}, cniError(cniwire.ErrAnnotationTimeout, "pod has no "+podnet.Annotation+" annotation", "")
	}
	nets, err := podnet.Decode(v)
	if err != nil {
		return podnet.Network{}, cniError(cniwire.ErrAnnotationTimeout, "pod annotation is invalid", err.Error())
	}
	n, _ := nets.Default()
	if n.PodUID != string(p.UID) {
		return n, cniError(cniwire.ErrUIDMismatch, "pod annotation was made for another pod UID",
			fmt.Sprintf("annotation %s, pod %s", n.PodUID, p.UID))
	}
	if n.PortID != podnet.PortID(string(p.UID)) {
		// Anyone who may edit the pod may write its annotation: the port
		// it names must be the one the watcher makes for this pod (the
		// agent checks the controller's record of it too). The watcher
		// rewrites a wrong annotation; until then, wait.
		return n, cniError(cniwire.ErrPortNotOwned, "pod annotation names another pod's port",
			fmt.Sprintf("annotation port %s, this pod's port %s", n.PortID, podnet.PortID(string(p.UID))))
	}
	if n.HostID != d.cfg.HostID {
		return n, cniError(cniwire.ErrAnnotationTimeout, "pod's port is bound to another host",
			fmt.Sprintf("port host %s, this host %s", n.HostID, d.cfg.HostID))
	}
	return n, nil
}

// waitAnnotation waits for the pod's annotation on the pod watch, polling
// the API server as a fallback, up to the annotation timeout.
func (d *Daemon) waitAnnotation(ctx context.Context, a PodArgs) (*corev1.Pod, podnet.Network, error) {
	key := a.Namespace + "/" + a.Name
	timer := time.NewTimer(d.cfg.AnnotationTimeout)
	defer timer.Stop()
	tick := time.NewTicker(d.cfg.PollInterval)
	defer tick.Stop()
	api := false
	var why *types.Error
	for {
		ev := d.podEvent(key)
		p, fromAPI, err := d.getPod(ctx, a.Namespace, a.Name, api)
		api = false
		switch {
		case errors.Is(err, kerrors.NotFound):
			d.dropPodEvent(key, ev)
			return nil, podnet.Network{}, cniError(cniwire.ErrPodNotFound, err.Error(), "")
		case err != nil:
			why = cniError(cniwire.ErrAnnotationTimeout, "pod not readable", err.Error())
		case a.UID != "" && string(p.UID) != a.UID:
			if !fromAPI {
				api = true // the cache may lag behind a replaced pod
				d.dropPodEvent(key, ev)
				continue
			}
			d.dropPodEvent(key, ev)
			return nil, podnet.Network{}, cniError(cniwire.ErrUIDMismatch, "pod was replaced",
				fmt.Sprintf("runtime's K8S_POD_UID %s, API's pod %s", a.UID, p.UID))
		default:
			n, e := d.annotationOf(p)
			if e == nil {
				d.dropPodEvent(key, ev)
				return p, n, nil
			}
			why = e
		}
		select {
		case <-ev:
		case <-tick.C:
			d.dropPodEvent(key, ev)
			api = true
		case <-timer.C:
			d.dropPodEvent(key, ev)
			why.Msg = fmt.Sprintf("after %s: %s", d.cfg.AnnotationTimeout, why.Msg)
			return nil, podnet.Network{}, why
		case <-ctx.Done():
			d.dropPodEvent(key, ev)
			return nil, podnet.Network{}, cniError(types.ErrTryAgainLater, "agent stopping", ctx.Err().Error())
		}
	}
}

func (d *Daemon) add(ctx context.Context, conf *types.NetConf, cid, ifname, netnsPath string, a PodArgs, tr *addTrace) (out []byte, retErr error) {
	if conf.RawPrevResult != nil {
		return nil, cniError(types.ErrInvalidNetworkConfig, "kurma-k8s must be the first plugin of its chain", "")
	}
	if _, err := os.Stat(netnsPath); err != nil {
		return nil, cniError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS", err.Error())
	}
	start := time.Now()
	pod, n, err := d.waitAnnotation(ctx, a)
	if err != nil {
		return nil, err
	}
	tr.annotation = time.Since(start)
	tr.pod, tr.port = pod.Namespace+"/"+pod.Name, n.PortID
	d.m.observePhase("annotation", tr.annotation)
	rec := &record{ContainerID: cid, IfName: ifname, NetNS: netnsPath, PortID: n.PortID,
		Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID)}
	if err := d.st.save(rec); err != nil {
		return nil, cniError(types.ErrIOFailure, "save attachment", err.Error())
	}
	d.mu.Lock()
	d.records[rec.key()] = rec
	d.mu.Unlock()
	notOwned := false
	defer func() {
		if retErr != nil && notOwned {
			// The agent refused the port (another pod's, or held by a
			// live sandbox): nothing was plugged, and a Detach would
			// unplug its owner. Forget the record only.
			if err := d.forget(rec.key()); err != nil {
				d.log.Warn("cnid: rollback of refused ADD", "container", cid, "err", err)
			}
			return
		}
		if retErr != nil {
			if err := d.del(context.WithoutCancel(ctx), rec.key()); err != nil {
				d.log.Warn("cnid: rollback of failed ADD", "container", cid, "err", err)
			}
		}
	}()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go d.attachDeadline(actx, cancel, n.PortID)
	if d.cfg.Policy != nil {
		start = time.Now()
		var ip netip.Addr
		for _, p := range n.Prefixes() {
			if p.Addr().Is4() {
				ip = p.Addr()
				break
			}
		}
		if err := d.cfg.Policy.WaitPod(actx, pod.Namespace, pod.Name, ip); err != nil {
			return nil, cniError(cniwire.ErrPolicyNotReady, "network policy not programmed", err.Error())
		}
		tr.policy = time.Since(start)
		d.m.observePhase("policy", tr.policy)
	}
	start = time.Now()
	port, err := d.cfg.Agent.Attach(actx, n.PortID, attachment(rec))
	if err != nil {
		if ctx.Err() == nil && actx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, context.Cause(actx))
		}
		notOwned = errors.Is(err, agent.ErrNotOwned)
		return nil, d.agentError("plug port "+n.PortID, err)
	}
	// The result (the pod IP the kubelet reports, which Services and
	// policies trust) comes from the annotation, which the pod's editors
	// can write: it must carry the port's own addresses.
	if e := sameAddresses(n, port); e != nil {
		return nil, e
	}
	tr.attach = time.Since(start)
	d.m.observePhase("attach", tr.attach)
	res, err := result(n, ifname, netnsPath)
	if err != nil {
		return nil, err
	}
	vr, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return nil, cniError(types.ErrIncompatibleCNIVersion, "convert result", err.Error())
	}
	var buf bytes.Buffer
	if err := vr.PrintTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sameAddresses checks that an annotation names the MAC and addresses of
// the controller's port.
func sameAddresses(n podnet.Network, p controllerapi.Port) *types.Error {
	var have []string
	for _, f := range p.FixedIPs {
		if a, err := netip.ParseAddr(f.IPAddress); err == nil {
			have = append(have, a.String())
		} else {
			have = append(have, f.IPAddress)
		}
	}
	var want []string
	for _, pf := range n.Prefixes() {
		want = append(want, pf.Addr().String())
	}
	slices.Sort(have)
	slices.Sort(want)
	if !strings.EqualFold(n.MAC, p.MACAddress) || !slices.Equal(have, want) {
		return cniError(cniwire.ErrPortNotOwned, "pod annotation's addresses are not its port's",
			fmt.Sprintf("annotation %s %v, port %s %v", n.MAC, want, p.MACAddress, have))
	}
	return nil
}

// attachment is what the agent is asked to plug for a record: the pod's
// port, which the controller must know as the watcher's port of this pod
// UID.
func attachment(rec *record) agent.Attachment {
	return agent.Attachment{NetNS: rec.NetNS, IfName: rec.IfName, DeviceID: rec.PodUID, DeviceOwner: podnet.PortOwner}
}

// attachDeadline ends an ADD's wait for its plug (cancel) after
// Config.AttachTimeout, unless the agent is plugging the port then: that
// wait goes on while the plug is under way, up to Config.PlugGrace more.
// Either cause wraps context.DeadlineExceeded.
func (d *Daemon) attachDeadline(ctx context.Context, cancel context.CancelCauseFunc, portID string) {
	const poll = 100 * time.Millisecond
	t := time.NewTimer(d.cfg.AttachTimeout)
	defer t.Stop()
	hard := time.Now().Add(d.cfg.AttachTimeout + d.cfg.PlugGrace)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch {
		case !d.cfg.Agent.Plugging(portID):
			cancel(fmt.Errorf("%w: not plugged within %s", context.DeadlineExceeded, d.cfg.AttachTimeout))
			return
		case !time.Now().Before(hard):
			cancel(fmt.Errorf("%w: plug still under way after %s", context.DeadlineExceeded, d.cfg.AttachTimeout+d.cfg.PlugGrace))
			return
		}
		t.Reset(min(poll, time.Until(hard)))
	}
}

// agentError maps an agent failure to a CNI error: the controller being
// out of reach is 103, a port that is not the pod's (or is held by a live
// sandbox) 106, anything else 104.
func (d *Daemon) agentError(what string, err error) *types.Error {
	synced := false
	select {
	case <-d.cfg.Agent.Synced():
		synced = true
	default:
	}
	if errors.Is(err, kerrors.Unavailable) || (!synced && errors.Is(err, context.DeadlineExceeded)) {
		return cniError(cniwire.ErrControllerUnreachable, "Kurma controller unreachable", what+": "+err.Error())
	}
	if errors.Is(err, agent.ErrNotOwned) {
		return cniError(cniwire.ErrPortNotOwned, "port is not this pod's", what+": "+err.Error())
	}
	return cniError(cniwire.ErrPlugFailed, "plug failed", what+": "+err.Error())
}

// result is the CNI 1.1 result for the pod's network.
func result(n podnet.Network, ifname, netnsPath string) (*types100.Result, error) {
	res := &types100.Result{CNIVersion: "1.1.0",
		Interfaces: []*types100.Interface{{Name: ifname, Mac: n.MAC, Sandbox: netnsPath}}}
	gws := map[bool]net.IP{}
	for _, g := range n.Gateways {
		a := netip.MustParseAddr(g)
		gws[a.Is4()] = net.IP(a.AsSlice())
	}
	for _, p := range n.Prefixes() {
		ipn := net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		res.IPs = append(res.IPs, &types100.IPConfig{Interface: types100.Int(0), Address: ipn, Gateway: gws[p.Addr().Is4()]})
		if gw := gws[p.Addr().Is4()]; gw != nil {
			res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: make(net.IP, len(ipn.IP)), Mask: net.CIDRMask(0, 8*len(ipn.IP))}, GW: gw})
		}
	}
	for _, r := range n.Routes {
		d := netip.MustParsePrefix(r.Dest)
		rt := &types.Route{Dst: net.IPNet{IP: net.IP(d.Addr().AsSlice()), Mask: net.CIDRMask(d.Bits(), d.Addr().BitLen())}}
		if r.NextHop != "" {
			rt.GW = net.IP(netip.MustParseAddr(r.NextHop).AsSlice())
		}
		res.Routes = append(res.Routes, rt)
	}
	return res, nil
}

// del detaches and forgets one attachment; unknown is success.
func (d *Daemon) del(ctx context.Context, key string) error {
	d.mu.Lock()
	rec := d.records[key]
	shared := false
	if rec != nil {
		for k, o := range d.records {
			if k != key && o.PortID == rec.PortID && o.NetNS != rec.NetNS && exists(o.NetNS) {
				shared = true // a newer sandbox of the pod holds the port
			}
		}
	}
	d.mu.Unlock()
	if rec == nil {
		return nil
	}
	if !shared {
		dctx, cancel := context.WithTimeout(ctx, d.cfg.AttachTimeout)
		defer cancel()
		if err := d.cfg.Agent.Detach(dctx, rec.PortID); err != nil {
			return d.agentError("unplug port "+rec.PortID, err)
		}
	}
	return d.forget(key)
}

// forget removes an attachment's record.
func (d *Daemon) forget(key string) error {
	if err := d.st.remove(key); err != nil {
		return cniError(types.ErrIOFailure, "remove attachment", err.Error())
	}
	d.mu.Lock()
	delete(d.records, key)
	d.mu.Unlock()
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// check compares the attachment with the pod's annotation and the
// interface inside the namespace.
func (d *Daemon) check(ctx context.Context, cid, ifname, netnsPath string, a PodArgs) error {
	d.mu.Lock()
	rec := d.records[cid+"_"+ifname]
	d.mu.Unlock()
	if rec == nil {
		return cniError(cniwire.ErrPlugFailed, "no attachment for this container and interface", "")
	}
	p, _, err := d.getPod(ctx, a.Namespace, a.Name, false)
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return cniError(cniwire.ErrPodNotFound, err.Error(), "")
		}
		return cniError(types.ErrTryAgainLater, "read pod", err.Error())
	}
	n, e := d.annotationOf(p)
	if e != nil {
		return e
	}
	if n.PortID != rec.PortID || rec.NetNS != netnsPath {
		return cniError(cniwire.ErrPlugFailed, "attachment does not match the pod's port",
			fmt.Sprintf("attached %s in %s, annotation %s", rec.PortID, rec.NetNS, n.PortID))
	}
	return ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return cniError(cniwire.ErrPlugFailed, "interface "+ifname+" missing", err.Error())
		}
		if !bytes.Equal(l.Attrs().HardwareAddr, n.HardwareAddr()) {
			return cniError(cniwire.ErrPlugFailed, "interface MAC differs", l.Attrs().HardwareAddr.String()+" != "+n.MAC)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			return cniError(cniwire.ErrPlugFailed, "interface "+ifname+" is down", "")
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return cniError(cniwire.ErrPlugFailed, "list addresses", err.Error())
		}
		for _, want := range n.Prefixes() {
			if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
				ones, _ := a.Mask.Size()
				return a.IP.Equal(net.IP(want.Addr().AsSlice())) && ones == want.Bits()
			}) {
				return cniError(cniwire.ErrPlugFailed, "address "+want.String()+" missing on "+ifname, "")
			}
		}
		return nil
	})
}

// gc detaches every attachment the runtime no longer lists.
func (d *Daemon) gc(ctx context.Context, conf *types.NetConf) error {
	valid := map[string]bool{}
	for _, v := range conf.ValidAttachments {
		valid[v.ContainerID+"_"+v.IfName] = true
	}
	d.mu.Lock()
	var stale []string
	for k := range d.records {
		if !valid[k] {
			stale = append(stale, k)
		}
	}
	d.mu.Unlock()
	d.log.Info("cnid: gc", "valid", len(valid), "stale", stale)
	var errs []error
	for _, k := range stale {
		if err := d.del(ctx, k); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return cniError(cniwire.ErrPlugFailed, "gc", errors.Join(errs...).Error())
	}
	return nil
}

// status: ready once the pod watch has synced and the agent has listed
// its ports.
func (d *Daemon) status() error {
	if !d.inf.HasSynced() {
		return cniError(types.ErrPluginNotAvailable, "pod watch not synced yet", "")
	}
	select {
	case <-d.cfg.Agent.Synced():
		return nil
	default:
		return cniError(types.ErrPluginNotAvailable, "agent has not reached the Kurma controller yet", "")
	}
}
