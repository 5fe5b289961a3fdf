package k8sinstall

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// inNS runs f in a network namespace (a socket made there stays there).
type inNS func(f func() error) error

// attempt is one new connection of a probe, judged by the kernel.
type attempt struct {
	start     time.Time // before connect (the client's clock)
	connected time.Time // when the handshake completed (start + the kernel's SYN RTT; zero on failure)
	answered  time.Time // when the answer arrived (the kernel's word; zero on failure)
	answer    string
	err       error
	late      time.Duration // how long after a deadline the client looked (it was not scheduled): not held against the path
}

// probeOnce opens a connection to addr from the namespace do enters, sends
// line and reads the one-line answer. The client's own scheduling is
// kept out of the verdict: the kernel says how long the handshake took
// (TCP_INFO's RTT of the SYN, and no retransmission) and when the answer
// arrived (TCP_INFO's time since the last data received), so an attempt
// fails only when the path did not complete the handshake within
// timeout, or the answer did not arrive within answerTimeout of the
// request, however late the client looks at the socket. A lost SYN is
// not waited for (TCP would resend it after 1 s): the attempt fails at
// its deadline and the caller opens a new one.
func probeOnce(do inNS, addr netip.AddrPort, line string, timeout, answerTimeout time.Duration) (a attempt) {
	var fd int
	if err := do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		return err
	}); err != nil {
		a.start, a.err = time.Now(), fmt.Errorf("socket: %w", err)
		return a
	}
	defer unix.Close(fd)
	a.start = time.Now()
	err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		a.err = fmt.Errorf("connect %v: %w", addr, err)
		return a
	}
	deadline := a.start.Add(timeout)
	waitFD(fd, unix.POLLOUT, deadline)
	if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soErr != 0 {
		if err == nil {
			err = unix.Errno(soErr)
		}
		a.err = fmt.Errorf("connect %v: %w", addr, err)
		return a
	}
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		a.err = fmt.Errorf("TCP_INFO: %w", err)
		return a
	}
	switch rtt := time.Duration(info.Rtt) * time.Microsecond; {
	case info.State != unix.BPF_TCP_ESTABLISHED:
		a.err = fmt.Errorf("connect %v: no handshake in %v: %w", addr, timeout, os.ErrDeadlineExceeded)
		return a
	case info.Total_retrans > 0 || rtt > timeout:
		a.err = fmt.Errorf("connect %v: handshake took %v, SYN sent %d times: %w", addr, rtt, 1+info.Total_retrans, os.ErrDeadlineExceeded)
		return a
	}
	a.connected = a.start.Add(time.Duration(info.Rtt) * time.Microsecond)
	a.late = max(0, time.Since(deadline))
	if _, err := unix.Write(fd, []byte(line+"\n")); err != nil {
		a.err = fmt.Errorf("write: %w", err)
		return a
	}
	asked := time.Now()
	deadline = asked.Add(answerTimeout)
	var got []byte
	buf := make([]byte, 256)
	for !bytes.Contains(got, []byte("\n")) {
		n, err := unix.Read(fd, buf)
		switch {
		case n > 0:
			got = append(got, buf[:n]...)
			continue
		case err == nil:
			a.err = fmt.Errorf("answer %q: %w", got, io.EOF)
			return a
		case !errors.Is(err, unix.EAGAIN):
			a.err = fmt.Errorf("read: %w", err)
			return a
		}
		if time.Now().After(deadline) {
			a.err = fmt.Errorf("no answer in %v (got %q): %w", answerTimeout, got, os.ErrDeadlineExceeded)
			return a
		}
		waitFD(fd, unix.POLLIN, deadline)
	}
	// When the answer arrived, by the kernel (ms, from its jiffies).
	if info, err = unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO); err != nil {
		a.err = fmt.Errorf("TCP_INFO: %w", err)
		return a
	}
	now := time.Now()
	a.answered = now.Add(-time.Duration(info.Last_data_recv) * time.Millisecond)
	if a.answered.Sub(asked) > answerTimeout {
		a.err = fmt.Errorf("answer after %v: %w", a.answered.Sub(asked), os.ErrDeadlineExceeded)
		a.answered = time.Time{}
		return a
	}
	a.late = max(a.late, now.Sub(deadline))
	a.answer = string(bytes.TrimSpace(got))
	return a
}

// waitFD polls fd for events until they come or deadline passes.
func waitFD(fd int, events int16, deadline time.Time) {
	for {
		ms := time.Until(deadline).Milliseconds()
		if ms <= 0 {
			return
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: events}}, int(ms))
		if n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
