package core

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

// keepAlive is how often an idle watch stream gets an empty line.
const keepAlive = 15 * time.Second

// toEvent converts a store event of a watch of kind k.
func toEvent(ev store.Event, k WatchKind) (capi.Event, error) {
	out := capi.Event{Revision: ev.Rev}
	raw := ev.Value
	switch {
	case ev.Type == store.EventDelete:
		out.Type, raw = capi.EventDeleted, ev.PrevValue
	case ev.PrevValue == nil:
		out.Type = capi.EventAdded
	default:
		out.Type = capi.EventModified
	}
	switch k {
	case WatchLoadBalancers:
		return svcEvent(out, ev.Key, raw, ev.Rev)
	case WatchHosts:
		var h capi.Host
		if err := json.Unmarshal(raw, &h); err != nil {
			return out, err
		}
		h.RevisionNumber = ev.Rev
		out.Host = &h
		return out, nil
	}
	var p capi.Port
	if err := json.Unmarshal(raw, &p); err != nil {
		return out, err
	}
	p.RevisionNumber = ev.Rev
	out.Port = &p
	return out, nil
}

// portFilter decides which port events a watch sends. With a host it
// keeps that host's ports; with peers as well, also every port of a VPC
// in which the host has a port (what an agent needs for its remote FDB
// and neighbour entries). It tracks the host's ports from the stream
// itself, so it sees a VPC appear on or leave the host, and a port leave
// the host (bound elsewhere), at the event that does it.
type portFilter struct {
	host  string
	peers bool
	local map[string]string // port key -> VPC key (pid/vpc) of host's ports
	vpcs  map[string]int    // VPC key -> number of host's ports in it (peers watches only)
}

func vpcOf(p *capi.Port) string { return p.ProjectID + "/" + p.VPCID }

// track updates the host's ports for an event. joined is the VPC key
// when the event brought the first host port into that VPC (peers
// watches only); left says that the event took a port the host had off
// it (bound to another host, or deleted): the watch sends it to the host
// as DELETED.
func (f *portFilter) track(e *capi.Event, key string) (joined string, left bool) {
	if f.host == "" || e.Port == nil {
		return "", false
	}
	v, had := f.local[key]
	if e.Port.BindingHostID != f.host || e.Type == capi.EventDeleted {
		if had {
			delete(f.local, key)
			if f.peers {
				if f.vpcs[v]--; f.vpcs[v] <= 0 {
					delete(f.vpcs, v)
				}
			}
		}
		return "", had
	}
	if had {
		return "", false
	}
	v = vpcOf(e.Port)
	f.local[key] = v
	if !f.peers {
		return "", false
	}
	f.vpcs[v]++
	if f.vpcs[v] == 1 {
		return v, false
	}
	return "", false
}

func (f *portFilter) keep(e *capi.Event) bool {
	switch {
	case f.host == "":
		return true
	case e.Port == nil:
		return false
	case e.Port.BindingHostID == f.host:
		return true
	default:
		return f.peers && f.vpcs[vpcOf(e.Port)] > 0
	}
}

// WatchKind says what a watch streams.
type WatchKind int

const (
	WatchPorts WatchKind = iota
	WatchHosts
	WatchLoadBalancers // load balancers and floating IPs
)

// WatchRequest is a typed watch: Since 0 starts with a listing (ADDED
// events, then SYNCED); Host and Peers filter port watches (see
// capi.Client.WatchHostPorts).
type WatchRequest struct {
	Kind  WatchKind
	Since int64
	Host  string
	Peers bool
}

// Sink receives a watch's stream. Start is called once, before the first
// event (and before SYNCED) and before the first KeepAlive: an error Watch
// returns before Start is the request's error; one after it ends a stream
// already under way. Send's error (the client is gone) ends the watch.
type Sink interface {
	Start()
	Send(capi.Event) error
	// Flush pushes buffered events out; called when no event is pending.
	Flush()
	// KeepAlive is called every keepAlive on an idle stream.
	KeepAlive()
}

func (r *WatchRequest) check() error {
	if r.Kind != WatchPorts && (r.Host != "" || r.Peers) {
		return kerrors.New(kerrors.Invalid, "binding:host_id and vpc_peers filter port watches only")
	}
	if strings.Contains(r.Host, "/") {
		return kerrors.New(kerrors.Invalid, "binding:host_id %q contains '/'", r.Host)
	}
	if r.Peers && r.Host == "" {
		return kerrors.New(kerrors.Invalid, "vpc_peers needs binding:host_id")
	}
	if r.Peers && r.Since > 0 {
		// The filter's state (which VPCs the host is in) is built from
		// the listing; it cannot be rebuilt for an old revision.
		return kerrors.New(kerrors.Invalid, "a vpc_peers watch cannot resume: watch with since=0 (it lists the host's ports and their VPCs first)")
	}
	if r.Since < 0 {
		return kerrors.New(kerrors.Invalid, "since %d: want a revision number >= 0", r.Since)
	}
	return nil
}

// Watch streams the events req asks for into sink until ctx ends, the
// store's watch fails or the sink's client goes.
func (s *Core) Watch(ctx context.Context, req WatchRequest, sink Sink) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := req.check(); err != nil {
		return err
	}
	f := &portFilter{host: req.Host, peers: req.Peers, local: map[string]string{}, vpcs: map[string]int{}}
	prefix := map[WatchKind]string{WatchPorts: "ports/", WatchHosts: "hosts/", WatchLoadBalancers: svcPrefix}[req.Kind]
	var wt store.Watcher
	if req.Since > 0 {
		var err error
		if wt, err = s.st.Watch(ctx, prefix, req.Since); err != nil {
			return err // 410 for compacted, before anything is written
		}
		sink.Start()
		sink.Flush()
	} else {
		sink.Start()
		rev, err := s.replay(ctx, sink, prefix, f, req.Kind)
		if err != nil {
			return err
		}
		if err := sink.Send(capi.Event{Type: capi.EventSynced, Revision: rev}); err != nil {
			return nil
		}
		sink.Flush()
		if wt, err = s.st.Watch(ctx, prefix, rev); err != nil {
			return err
		}
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-wt.Events():
			if !ok {
				if err := wt.Err(); err != nil && ctx.Err() == nil {
					return err
				}
				return nil
			}
			e, err := toEvent(ev, req.Kind)
			if err != nil {
				s.log.Warn("undecodable stored object in watch", "key", ev.Key, "err", err)
				continue
			}
			joined, left := f.track(&e, ev.Key)
			if left && e.Type != capi.EventDeleted {
				// Bound to another host: gone from this one. (Still a
				// port of a VPC the host is in, it follows as such.)
				gone := e
				gone.Type = capi.EventDeleted
				if err := sink.Send(gone); err != nil {
					return nil // client gone
				}
			}
			if (left && e.Type == capi.EventDeleted) || f.keep(&e) {
				if err := sink.Send(e); err != nil {
					return nil // client gone
				}
			}
			if joined != "" {
				// The host's first port in this VPC: send the VPC's other
				// ports as they are now. Events for them older than what
				// is sent may follow; revision numbers order them.
				if err := s.replayVPC(ctx, sink, joined, f.host, e.Revision); err != nil {
					return err
				}
			}
			if len(wt.Events()) == 0 {
				sink.Flush()
			}
		case <-tick.C:
			sink.KeepAlive()
		case <-ctx.Done():
			return nil
		}
	}
}

// replay writes the current objects as ADDED events and returns the
// revision to watch from.
func (s *Core) replay(ctx context.Context, sink Sink, prefix string, f *portFilter, k WatchKind) (int64, error) {
	emit := func(kv store.KV) error {
		e, err := toEvent(store.Event{Type: store.EventPut, Key: kv.Key, Value: kv.Value, Rev: kv.ModRev}, k)
		if err != nil {
			return err
		}
		e.Type = capi.EventAdded
		f.track(&e, kv.Key)
		return sink.Send(e)
	}
	if f.host == "" {
		return s.st.ForEach(ctx, prefix, emit)
	}
	// Use the host index, then read each port; the watch that follows
	// starts at the index snapshot, so later changes arrive as events.
	idx := "idx/host/" + f.host + "/"
	var keys []string
	rev, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
		keys = append(keys, "ports/"+kv.Key[len(idx):])
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, k := range keys {
		kv, err := s.st.Get(ctx, k)
		if errors.Is(err, kerrors.NotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if err := emit(kv); err != nil {
			return 0, err
		}
	}
	vpcs := make([]string, 0, len(f.vpcs))
	for v := range f.vpcs {
		vpcs = append(vpcs, v)
	}
	slices.Sort(vpcs)
	for _, v := range vpcs {
		if err := s.replayVPC(ctx, sink, v, f.host, 0); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// replayVPC writes the ports of VPC key v (pid/vpc) not bound to host as
// ADDED events with stream revision rev (0 while listing: then each event
// carries its port's revision, as the other listed ports do).
func (s *Core) replayVPC(ctx context.Context, sink Sink, v, host string, rev int64) error {
	idx := "idx/vpc/" + v + "/"
	pid, _, _ := strings.Cut(v, "/")
	var keys []string
	if _, err := s.st.ForEach(ctx, idx, func(kv store.KV) error {
		keys = append(keys, portKey(pid, kv.Key[len(idx):]))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		kv, err := s.st.Get(ctx, k)
		if errors.Is(err, kerrors.NotFound) {
			continue
		}
		if err != nil {
			return err
		}
		p, err := decodePort(kv)
		if err != nil {
			return err
		}
		if p.BindingHostID == host {
			continue
		}
		ev := capi.Event{Type: capi.EventAdded, Revision: rev, Port: &p}
		if rev == 0 {
			ev.Revision = p.RevisionNumber // listing: as the other listed ports
		}
		if err := sink.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// svcEvent fills out with the load balancer or floating IP stored as raw
// under key.
func svcEvent(out capi.Event, key string, raw []byte, rev int64) (capi.Event, error) {
	if strings.HasPrefix(key, "svc/lb/") {
		var lb capi.LoadBalancer
		if err := json.Unmarshal(raw, &lb); err != nil {
			return out, err
		}
		lb.RevisionNumber = rev
		out.LoadBalancer = &lb
		return out, nil
	}
	var f capi.FloatingIP
	if err := json.Unmarshal(raw, &f); err != nil {
		return out, err
	}
	f.RevisionNumber = rev
	out.FloatingIP = &f
	return out, nil
}
