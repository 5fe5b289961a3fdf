package stager

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// The pod init serves the call-ins on SocketPath, a SOCK_SEQPACKET socket:
// one JSON message per packet, file descriptors riding along as SCM_RIGHTS.
// The stager talks to init over a socketpair with the same framing.

// Operations of a request.
const (
	opStart    = "start"    // stager -> init: start the apps of Plan
	opShutdown = "shutdown" // stager -> init: TERM, grace, KILL, exit
	opStatus   = "status"   // call-in: the pod's Status
	opRun      = "run"      // call-in: run a process (fds: stdin, stdout, stderr)
	opAttach   = "attach"   // call-in: get the app's stdin and output streams
)

// CloseStdinFlag, after the app name of the attach call-in, makes the
// caller's EOF on stdin close the app's stdin (see Attach).
const CloseStdinFlag = "-close-stdin"

type request struct {
	Op       string                  `json:"op"`
	App      string                  `json:"app,omitempty"`
	Settings *stagerspec.RunSettings `json:"settings,omitempty"`
	Plan     []AppPlan               `json:"plan,omitempty"`
	Hostname string                  `json:"hostname,omitempty"`
	// Slave (start only): make init's mounts rslave, not rprivate
	// (stagerspec.VolumePropagationAnnotation).
	Slave   bool  `json:"slave,omitempty"`
	GraceNS int64 `json:"graceNS,omitempty"`
	// LogMaxBytes is the app log rotation size (start only).
	LogMaxBytes int64 `json:"logMaxBytes,omitempty"`
	// CloseStdin (attach only): init hands its own end of the app's stdin
	// to this caller, whose EOF then closes the app's stdin.
	CloseStdin bool `json:"closeStdin,omitempty"`
}

type response struct {
	Error    string            `json:"error,omitempty"`
	Kind     string            `json:"kind,omitempty"` // kerrors.Type of Error
	Status   stagerspec.Status `json:"status,omitempty"`
	PID      int               `json:"pid,omitempty"`
	Exited   bool              `json:"exited,omitempty"`
	ExitCode int               `json:"exitCode,omitempty"`
	TTY      bool              `json:"tty,omitempty"`
	// ExecCode is an ExecError's code: the command could not be run.
	ExecCode int `json:"execCode,omitempty"`
}

func errResponse(err error) response {
	r := response{Error: err.Error(), Kind: kerrors.Type(err)}
	var ee *ExecError
	if errors.As(err, &ee) {
		r.ExecCode = ee.Code
	}
	return r
}

func (r response) err() error {
	if r.Error == "" {
		return nil
	}
	err := kerrors.FromType(r.Kind, r.Error)
	if r.ExecCode != 0 {
		return &ExecError{Code: r.ExecCode, Err: err}
	}
	return err
}

// Exit codes of a command that could not be run, as shells (and docker,
// podman) use them: the stager role and the run call-in exit with them.
const (
	ExitCannotExec = 126 // found but not executable, or no such working directory
	ExitNotFound   = 127 // no such command
)

// ExecError says that an app's command could not be executed, with the
// exit code to report for it (ExitCannotExec or ExitNotFound).
type ExecError struct {
	Code int
	Err  error
}

func (e *ExecError) Error() string { return e.Err.Error() }
func (e *ExecError) Unwrap() error { return e.Err }

const maxPacket = 1 << 20

// send writes one message with optional descriptors.
func send(c *net.UnixConn, v any, files ...*os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxPacket {
		return kerrors.New(kerrors.Invalid, "message too large")
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// recv reads one message into v and returns the descriptors that came with
// it (the caller owns them). It returns io.EOF-like errors when the peer is
// gone.
func recv(c *net.UnixConn, v any) ([]*os.File, error) {
	size, err := nextSize(c)
	if err != nil {
		return nil, err
	}
	// A buffer of the message's own size: a fresh maxPacket buffer per
	// message costs 256 page faults to zero it and a garbage collection in
	// a small heap.
	buf := make([]byte, max(1, min(size, maxPacket)))
	oob := make([]byte, syscall.CmsgSpace(8*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("parse control message: %w", err)
		}
		for _, m := range msgs {
			fds, err := syscall.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				syscall.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "passed"))
			}
		}
	}
	if n == 0 {
		closeAll(files)
		return nil, errPeerGone
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		closeAll(files)
		return nil, kerrors.New(kerrors.Invalid, "decode message: %v", err)
	}
	return files, nil
}

var errPeerGone = fmt.Errorf("peer closed the connection")

// nextSize waits for the next message on c and returns its length without
// taking it (MSG_PEEK|MSG_TRUNC on a SOCK_SEQPACKET socket give the whole
// length whatever the buffer); 0 when the peer is gone.
func nextSize(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, fmt.Errorf("peek message: %w", rerr)
	}
	return n, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// dial connects to the pod init's call-in socket.
func dial(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("%w: pod init not reachable: %w", kerrors.Unavailable, err)
	}
	return c, nil
}

// socketpair returns a connected SEQPACKET pair as a conn for us and a file
// for a child.
func socketpair() (*net.UnixConn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "ctl")
	defer ours.Close()
	fc, err := net.FileConn(ours)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair conn: %w", err)
	}
	return fc.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "ctl-child"), nil
}

func fileConn(f *os.File) (*net.UnixConn, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, kerrors.New(kerrors.Invalid, "not a unix socket")
	}
	return uc, nil
}
