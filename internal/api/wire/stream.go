package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// Frame kinds of the stream protocol. After the upgrade both sides send
// frames: a 1-byte kind, a 4-byte big-endian payload length, the payload.
// The client sends stdin and control (resize, stdin-close); the server sends
// stdout, stderr and control (pod, exit, error). The exit or error control
// frame is the server's last.
const (
	FrameStdin   byte = 0
	FrameStdout  byte = 1
	FrameStderr  byte = 2
	FrameControl byte = 3
)

// MaxFrame bounds a frame's payload; writers split larger writes.
const MaxFrame = 1 << 20

// FrameWriter writes frames to one connection from any goroutine.
type FrameWriter struct {
	mu sync.Mutex // guards w: one frame at a time
	w  io.Writer
}

// NewFrameWriter returns a FrameWriter on w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// WriteFrame sends one frame of kind with payload p (at most MaxFrame).
func (fw *FrameWriter) WriteFrame(kind byte, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := fw.w.Write(append(hdr[:], p...)); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Control sends a control frame.
func (fw *FrameWriter) Control(c Control) error {
	return fw.WriteFrame(FrameControl, MustJSON(c))
}

// Stream returns a writer that sends everything written as frames of kind.
func (fw *FrameWriter) Stream(kind byte) io.Writer { return streamWriter{fw, kind} }

type streamWriter struct {
	fw   *FrameWriter
	kind byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > MaxFrame {
			chunk = chunk[:MaxFrame]
		}
		if err := s.fw.WriteFrame(s.kind, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// ReadFrame reads one frame. io.EOF means the peer closed between frames.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds limit %d", n, MaxFrame)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("read frame payload: %w", io.ErrUnexpectedEOF)
	}
	return hdr[0], p, nil
}

// DecodeControl parses a control frame's payload.
func DecodeControl(p []byte) (Control, error) {
	var c Control
	if err := json.Unmarshal(p, &c); err != nil {
		return c, fmt.Errorf("bad control frame: %w", err)
	}
	return c, nil
}
