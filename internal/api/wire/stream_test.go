package wire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	fw := &FrameWriter{w: &buf}
	big := strings.Repeat("x", MaxFrame+10)
	if _, err := io.WriteString(fw.Stream(FrameStdout), big); err != nil {
		t.Fatal(err)
	}
	if err := fw.Control(Control{Type: "exit", Code: 3}); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for {
		kind, p, err := ReadFrame(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if kind == FrameControl {
			c, err := DecodeControl(p)
			if err != nil || c.Type != "exit" || c.Code != 3 {
				t.Fatalf("control %+v %v", c, err)
			}
			break
		}
		got.Write(p)
	}
	if got.String() != big {
		t.Fatalf("reassembled %d bytes, want %d", got.Len(), len(big))
	}
	if _, _, err := ReadFrame(&buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after last frame: %v", err)
	}
	// A header announcing more than the limit is refused, not allocated.
	if _, _, err := ReadFrame(bytes.NewReader([]byte{1, 0xff, 0xff, 0xff, 0xff})); err == nil {
		t.Fatal("oversized frame accepted")
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{1, 0, 0, 0, 9, 'a'})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: %v", err)
	}
}

// FuzzReadFrame feeds arbitrary bytes to the frame reader and the control
// decoder, as a hostile peer would.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0, 0, 0, 0, 3, 'a', 'b', 'c', 3, 0, 0, 0, 30})
	f.Add([]byte(`{"type":"resize","rows":24,"cols":80}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		total := 0
		for {
			kind, p, err := ReadFrame(r)
			if err != nil {
				break
			}
			if len(p) > MaxFrame {
				t.Fatalf("frame of %d bytes", len(p))
			}
			total += 5 + len(p)
			if kind == FrameControl {
				_, _ = DecodeControl(p)
			}
		}
		if total > len(data) {
			t.Fatalf("read %d bytes of frames from %d", total, len(data))
		}
	})
}
