package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"kurma.dev/kurma/internal/pod/podtypes"
)

// isTerminal reports whether r or w is a terminal (an *os.File on a tty).
func isTerminal(f any) bool {
	if fd, ok := fdOf(f); ok {
		return term.IsTerminal(fd)
	}
	return false
}

func fdOf(f any) (int, bool) {
	if file, ok := f.(*os.File); ok {
		return int(file.Fd()), true
	}
	return 0, false
}

// ttySession puts the caller's terminal in raw mode and reports its size
// changes. restore must be called (it is safe when nothing was changed).
type ttySession struct {
	resize  chan podtypes.TermSize
	restore func()
	rows    uint16
	cols    uint16
}

func startTTY(ctx context.Context, in io.Reader, out io.Writer) *ttySession {
	ts := &ttySession{resize: make(chan podtypes.TermSize, 4), restore: func() {}}
	if ofd, ok := fdOf(out); ok && term.IsTerminal(ofd) {
		if w, h, err := term.GetSize(ofd); err == nil {
			ts.cols, ts.rows = uint16(w), uint16(h)
			ts.resize <- podtypes.TermSize{Rows: ts.rows, Cols: ts.cols}
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGWINCH)
		wctx, cancel := context.WithCancel(ctx)
		go func() {
			for {
				select {
				case <-wctx.Done():
					return
				case <-sig:
					if w, h, err := term.GetSize(ofd); err == nil {
						select {
						case ts.resize <- podtypes.TermSize{Rows: uint16(h), Cols: uint16(w)}:
						default:
						}
					}
				}
			}
		}()
		prev := ts.restore
		ts.restore = func() { signal.Stop(sig); cancel(); prev() }
	}
	if ifd, ok := fdOf(in); ok && term.IsTerminal(ifd) {
		if st, err := term.MakeRaw(ifd); err == nil {
			prev := ts.restore
			ts.restore = func() { _ = term.Restore(ifd, st); prev() }
		}
	}
	return ts
}
