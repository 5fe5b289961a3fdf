package testutil

import (
	"net"
	"testing"
)

// ServeConns hands every connection accepted on ln to h, each in its own
// goroutine, and closes the connection when h returns. ln is closed when
// the test ends, which ends the loop.
func ServeConns(t testing.TB, ln net.Listener, h func(net.Conn)) {
	t.Helper()
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h(c)
			}()
		}
	}()
}

// ServeDatagrams answers every datagram read on pc with reply(from), or
// with nothing when reply returns nil. pc is closed when the test ends,
// which ends the loop.
func ServeDatagrams(t testing.TB, pc net.PacketConn, reply func(from net.Addr) []byte) {
	t.Helper()
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if b := reply(from); b != nil {
				_, _ = pc.WriteTo(b, from)
			}
		}
	}()
}
