package cniconformance

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// DialBetween checks that a TCP connection from netns from reaches a
// listener on ip in netns to and carries a byte each way.
func DialBetween(to, from ns.NetNS, ip string) error {
	var l net.Listener
	err := to.Do(func(ns.NetNS) (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(ip, "0"))
		return err
	})
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err == nil {
			_, _ = c.Write(b)
		}
	}()
	return from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte{'k'}); err != nil {
			return err
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("echo: %w", err)
		}
		return nil
	})
}
