package datapath

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// WatchGone calls gone with the port id of every owned host end that
// disappears (its pod namespace was deleted, or someone removed it) until
// ctx ends. A subscription that breaks is renewed after a second; events
// in between are lost, so callers keep a periodic resync. It returns once
// the first subscription is in place.
func (d *Datapath) WatchGone(ctx context.Context, gone func(portID string)) error {
	ch, done, err := d.subscribeLinks(ctx)
	if err != nil {
		return err
	}
	go func() {
		for {
			d.forwardGone(ctx, ch, gone)
			close(done)
			for {
				if !sleepCtx(ctx, time.Second) {
					return
				}
				if ch, done, err = d.subscribeLinks(ctx); err == nil {
					break
				}
				d.log.Warn("link events: resubscribe", "err", err)
			}
		}
	}()
	return nil
}

// forwardGone passes deletions of our port links to gone until ctx ends
// or the subscription closes ch.
func (d *Datapath) forwardGone(ctx context.Context, ch <-chan netlink.LinkUpdate, gone func(string)) {
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-ch:
			if !ok {
				return
			}
			if u.Header.Type != unix.RTM_DELLINK || u.Link == nil {
				continue
			}
			a := u.Link.Attrs()
			if id, ok := d.names.ownsPort(a.Name, a.Alias); ok {
				gone(id)
			}
		}
	}
}

func (d *Datapath) subscribeLinks(ctx context.Context) (chan netlink.LinkUpdate, chan struct{}, error) {
	opts := netlink.LinkSubscribeOptions{
		// Every link change in the host namespace is an event (a plug
		// makes several), and a pod burst makes them faster than a
		// loaded agent reads them: with the default buffer the socket
		// overflowed (ENOBUFS), which ends the subscription and loses
		// the events until it is renewed.
		ReceiveBufferSize: linkEventsBuf, ReceiveBufferForceSize: true,
		ErrorCallback: func(err error) {
			if ctx.Err() == nil {
				d.log.Warn("link events", "err", err)
			}
		},
	}
	if d.cfg.HostNS != "" {
		nsh, err := netns.GetFromPath(d.cfg.HostNS)
		if err != nil {
			return nil, nil, fmt.Errorf("watch links: %w", err)
		}
		defer nsh.Close() // the subscription holds its own socket
		opts.Namespace = &nsh
	}
	ch := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(ch, done, opts); err != nil {
		return nil, nil, fmt.Errorf("watch links: %w", err)
	}
	return ch, done, nil
}

// linkEventsBuf is the receive buffer of the link event socket: a few
// thousand events (each several KiB of the kernel's accounting).
const linkEventsBuf = 16 << 20

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
