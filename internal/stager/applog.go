package stager

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// DefaultLogMaxBytes is the size at which an app's log is rotated unless
// stagerConfig sets logMaxBytes.
const DefaultLogMaxBytes = 10 << 20

// MinLogMaxBytes is the smallest logMaxBytes accepted.
const MinLogMaxBytes = 1024

// LogPath is an app's current log; OldLogPath holds the one before it.
func LogPath(app string) string { return filepath.Join(LogsDir, app) }

// OldLogPath is where the rotated log of app is kept (one generation).
func OldLogPath(app string) string { return LogPath(app) + ".1" }

// appLog is an app's log file, rotated when it would grow past max: the
// current file becomes OldLogPath (replacing the previous one) and a new
// one is started, so an app's logs never take more than 2*max bytes.
type appLog struct {
	path string
	max  int64

	mu   sync.Mutex // guards f, size
	f    *os.File
	size int64
}

func openAppLog(path string, max int64) (*appLog, error) {
	if max <= 0 {
		max = DefaultLogMaxBytes
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &appLog{path: path, max: max, f: f, size: fi.Size()}, nil
}

// Write appends b, rotating as often as needed so that no file exceeds
// max bytes.
func (l *appLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	written := 0
	for len(b) > 0 {
		if l.size >= l.max {
			if err := l.rotate(); err != nil {
				return written, err
			}
		}
		chunk := b[:min(int64(len(b)), l.max-l.size)]
		n, err := l.f.Write(chunk)
		written += n
		l.size += int64(n)
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

// rotate moves the current file to OldLogPath and starts a new one.
// Called with mu held.
func (l *appLog) rotate() error {
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate log: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("rotate log: %w", err)
	}
	l.f.Close()
	l.f, l.size = f, 0
	return nil
}

func (l *appLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// logReader reads an app's logs across rotations: the old generation
// first (if any), then the current file, following it to its new
// incarnation when it is rotated.
type logReader struct {
	app string
	cur *os.File
}

// openLogs opens app's logs for reading and copies everything they hold
// so far (old generation, then current) to w.
func openLogs(app string, w io.Writer) (*logReader, error) {
	cur, err := os.Open(LogPath(app))
	if err != nil {
		return nil, err
	}
	r := &logReader{app: app, cur: cur}
	if old, err := os.Open(OldLogPath(app)); err == nil {
		// If a rotation happened since we opened cur, "old" is cur itself.
		if !sameFile(old, cur) {
			_, err = io.Copy(w, old)
		}
		old.Close()
		if err != nil {
			cur.Close()
			return nil, fmt.Errorf("write log: %w", err)
		}
	}
	if _, err := io.Copy(w, cur); err != nil {
		cur.Close()
		return nil, fmt.Errorf("write log: %w", err)
	}
	return r, nil
}

// follow copies what was appended since the last call, moving on to the
// new current file after a rotation. It catches up with one rotation per
// call; a follower that misses two in a row loses the middle generation.
func (r *logReader) follow(w io.Writer) error {
	if _, err := io.Copy(w, r.cur); err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	next, err := os.Open(LogPath(r.app))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // between rename and create
		}
		return err
	}
	if sameFile(next, r.cur) {
		next.Close()
		return nil
	}
	r.cur.Close()
	r.cur = next
	_, err = io.Copy(w, r.cur)
	if err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	return nil
}

func (r *logReader) Close() error { return r.cur.Close() }

func sameFile(a, b *os.File) bool {
	fa, err1 := a.Stat()
	fb, err2 := b.Stat()
	if err1 != nil || err2 != nil {
		return false
	}
	sa, ok1 := fa.Sys().(*syscall.Stat_t)
	sb, ok2 := fb.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
