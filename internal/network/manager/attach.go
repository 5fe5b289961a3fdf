package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/kerrors"
)

// Attachment is one entry of Pod.Networks: a network the pod is attached
// to, its interface in the pod and the plugin's result.
type Attachment struct {
	Network   string          `json:"network"`
	Interface string          `json:"interface,omitempty"`
	Result    *netconf.Result `json:"result,omitempty"`
}

// DecodeAttachments reads Pod.Networks back.
func DecodeAttachments(raw []json.RawMessage) ([]Attachment, error) {
	out := make([]Attachment, 0, len(raw))
	for i, r := range raw {
		var a Attachment
		if err := json.Unmarshal(r, &a); err != nil {
			return nil, kerrors.New(kerrors.Invalid, "pod network %d: %v", i, err)
		}
		if err := netconf.ValidateName(a.Network); err != nil {
			return nil, fmt.Errorf("pod network %d: %w", i, err)
		}
		if a.Interface != "" {
			if err := netconf.ValidIfName(a.Interface); err != nil {
				return nil, fmt.Errorf("pod network %d: %w", i, err)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// wantsNetworks reports whether the pod is attached by this manager at all.
func wantsNetworks(p *pod.Pod) bool {
	n := p.Spec.Networks
	return !(len(n) == 1 && (n[0] == netconf.NetworkHost || n[0] == netconf.NetworkNone))
}

// Attach adds the pod to its networks in order (the named ones, or the
// default networks when it names none) and returns one Attachment per
// network as Pod.Networks entries. On any failure every network already
// added is removed again, in reverse order, and the failing plugin's error
// is returned.
func (m *Manager) Attach(ctx context.Context, p *pod.Pod) (_ []json.RawMessage, retErr error) {
	if !wantsNetworks(p) {
		return nil, nil
	}
	if p.NetNS == "" {
		return nil, kerrors.New(kerrors.Invalid, "pod %s has no network namespace", p.UUID)
	}
	nets, err := netconf.Select(m.opts.Networks, p.Spec.Networks)
	if err != nil {
		return nil, err
	}
	names, err := netconf.InterfaceNames(nets, netconf.RenderOptions{PodUUID: p.UUID})
	if err != nil {
		return nil, err
	}
	unlock := m.lockPod(p.UUID)
	defer unlock()
	cp, err := m.netnsRef(p, false)
	if err != nil {
		return nil, err
	}

	var done []Attachment
	defer func() {
		if retErr != nil && len(done) > 0 {
			if err := m.delAll(cp, done); err != nil {
				m.log.Warn("roll back pod networks", "pod", p.UUID, "err", err)
			}
		}
		if retErr != nil {
			m.dropNetNSRef(p)
		}
	}()
	out := make([]json.RawMessage, 0, len(nets))
	for i, n := range nets {
		wctx, cancel := context.WithTimeout(ctx, m.opts.CallTimeout)
		err := m.waitRunning(wctx, n.Name)
		cancel()
		if err != nil {
			return nil, err
		}
		res, err := m.add(ctx, cp, n, names[i])
		if err != nil {
			// The failing add may have left part of its work behind.
			done = append(done, Attachment{Network: n.Name, Interface: names[i]})
			return nil, err
		}
		a := Attachment{Network: n.Name, Interface: names[i], Result: res}
		done = append(done, a)
		b, err := json.Marshal(a)
		if err != nil {
			return nil, fmt.Errorf("encode attachment: %w", err)
		}
		out = append(out, b)
	}
	if err := writeResolvConf(p, done); err != nil {
		return nil, err
	}
	return out, nil
}

// Detach removes the pod from the networks recorded in p.Networks, in
// reverse order. A failing del is retried (Options.DelAttempts) and then
// reported; the others still run. It is idempotent.
func (m *Manager) Detach(ctx context.Context, p *pod.Pod) error {
	if !wantsNetworks(p) || len(p.Networks) == 0 {
		return nil
	}
	atts, err := DecodeAttachments(p.Networks)
	if err != nil {
		return err
	}
	unlock := m.lockPod(p.UUID)
	defer unlock()
	cp, err := m.netnsRef(p, true)
	if err != nil {
		return err
	}
	err = m.delAll(cp, atts)
	m.dropNetNSRef(p)
	return err
}

// delAll runs del for atts in reverse order on a detached context.
func (m *Manager) delAll(p *pod.Pod, atts []Attachment) error {
	var errs []error
	for i := len(atts) - 1; i >= 0; i-- {
		a := atts[i]
		n, err := m.network(a.Network)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		wctx, cancel := context.WithTimeout(context.Background(), m.opts.CallTimeout)
		m.waitStarted(wctx, n.Name)
		cancel()
		for try := 1; ; try++ {
			err = m.del(p, n, a.Interface)
			if err == nil {
				break
			}
			if try >= m.opts.DelAttempts {
				errs = append(errs, fmt.Errorf("network %q: del failed %d times: %w", n.Name, try, err))
				break
			}
			time.Sleep(time.Duration(try) * 100 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

func callArgs(p *pod.Pod, ifname string) []string {
	args := []string{p.NetNS, p.UUID}
	if ifname != "" {
		args = append(args, ifname)
	}
	return args
}

func (m *Manager) add(ctx context.Context, p *pod.Pod, n netconf.Network, ifname string) (*netconf.Result, error) {
	cctx, cancel := context.WithTimeout(ctx, m.opts.CallTimeout)
	defer cancel()
	start := time.Now()
	o, err := m.opts.Caller.Call(cctx, n.Name, VerbAdd, callArgs(p, ifname), n.Config)
	m.log.Debug("network add", "pod", p.UUID, "network", n.Name, "code", o.Code, "took", time.Since(start), "err", err)
	if err != nil {
		if cctx.Err() == context.DeadlineExceeded {
			return nil, kerrors.New(kerrors.Timeout, "network %q: add did not finish within %s (killed)", n.Name, m.opts.CallTimeout)
		}
		return nil, fmt.Errorf("network %q: add: %w", n.Name, err)
	}
	if o.Code != 0 {
		return nil, fmt.Errorf("network %q: add exited with %d: %s", n.Name, o.Code, callError(o))
	}
	res, err := netconf.ParseResult(o.Stdout)
	if err != nil {
		return nil, fmt.Errorf("network %q: add printed no valid result: %w", n.Name, err)
	}
	return res, nil
}

func (m *Manager) del(p *pod.Pod, n netconf.Network, ifname string) error {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.CallTimeout)
	defer cancel()
	o, err := m.opts.Caller.Call(ctx, n.Name, VerbDel, callArgs(p, ifname), n.Config)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return kerrors.New(kerrors.Timeout, "del did not finish within %s (killed)", m.opts.CallTimeout)
		}
		return fmt.Errorf("del: %w", err)
	}
	if o.Code != 0 {
		return fmt.Errorf("del exited with %d: %s", o.Code, callError(o))
	}
	return nil
}

// callError is the message of a failed call: a CNI error object on stdout,
// else stderr, else stdout, cut to a readable length.
func callError(o Output) string {
	if perr, ok := netconf.ParseError(o.Stdout); ok {
		msg := perr.Msg
		if perr.Details != "" {
			msg += ": " + perr.Details
		}
		return clip(msg)
	}
	if s := strings.TrimSpace(string(o.Stderr)); s != "" {
		return clip(s)
	}
	if s := strings.TrimSpace(string(o.Stdout)); s != "" {
		return clip(s)
	}
	return "no output"
}

func clip(s string) string {
	const max = 1024
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// writeResolvConf merges the results' DNS into <pod dir>/resolv.conf; it
// writes nothing when no result has DNS.
func writeResolvConf(p *pod.Pod, atts []Attachment) error {
	var ns, search, opts []string
	add := func(dst *[]string, vals []string) {
		for _, v := range vals {
			if v = strings.TrimSpace(v); v != "" && !strings.ContainsAny(v, " \t\r\n") && !contains(*dst, v) {
				*dst = append(*dst, v)
			}
		}
	}
	for _, a := range atts {
		if a.Result == nil {
			continue
		}
		add(&ns, a.Result.DNS.Nameservers)
		if a.Result.DNS.Domain != "" {
			add(&search, []string{a.Result.DNS.Domain})
		}
		add(&search, a.Result.DNS.Search)
		add(&opts, a.Result.DNS.Options)
	}
	// Only a pod manager's <pod>/netns reference has a pod dir beside it.
	if len(ns)+len(search)+len(opts) == 0 || filepath.Base(p.NetNS) != "netns" {
		return nil
	}
	var b bytes.Buffer
	for _, s := range ns {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(search, " "))
	}
	if len(opts) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(opts, " "))
	}
	dir := filepath.Dir(p.NetNS)
	path := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// The stager copies its own /etc/resolv.conf into every app: put the
	// file into its root's writable layer (the overlay's upper folder, or
	// the copied root), which it reads only once told to start the apps.
	for _, root := range []string{"stager.upper", "stager"} {
		r := filepath.Join(dir, root)
		if fi, err := os.Lstat(r); err != nil || !fi.IsDir() {
			continue
		}
		etc := filepath.Join(r, "etc")
		if err := os.MkdirAll(etc, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", etc, err)
		}
		if fi, err := os.Lstat(etc); err != nil || !fi.IsDir() {
			return fmt.Errorf("%s is not a folder", etc)
		}
		dst := filepath.Join(etc, "resolv.conf")
		_ = os.Remove(dst) // never write through a symlink
		if err := os.WriteFile(dst, b.Bytes(), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", dst, err)
		}
		break
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
