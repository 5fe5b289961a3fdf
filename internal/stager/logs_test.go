package stager_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLogRotation runs apps that write far more than a small logMaxBytes
// and checks that the logs stay bounded, that logs reads the old and the
// current file in order, and that logs -f follows through rotations.
func TestLogRotation(t *testing.T) {
	const max = 4096
	// 400 numbered lines of 40 bytes in bursts of 20, 50 ms apart, after
	// a pause that lets the follower start.
	script := `sleep 0.5; i=0; while [ $i -lt 400 ]; do printf 'line-%04d-padpadpadpadpadpadpadpadpad\n' $i; i=$((i+1)); [ $((i%20)) = 0 ] && sleep 0.05; done; exit 0`
	p := newPod(t, podOpts{config: fmt.Sprintf(`{"logMaxBytes":%d}`, max)},
		podApp{name: "chatty", exec: []string{"/bin/sh", "-c", script}},
	)
	if !p.waitReady(30 * time.Second) {
		t.Fatalf("stager exited at readiness:\n%s", p.out.String())
	}
	var want strings.Builder
	for i := range 400 {
		fmt.Fprintf(&want, "line-%04d-padpadpadpadpadpadpadpadpad\n", i)
	}
	follow := make(chan callResult, 1)
	go func() { follow <- p.callin(nil, nil, nil, "logs", "chatty", "-f") }()

	t.Run("follow survives rotation", func(t *testing.T) {
		select {
		case res := <-follow:
			if res.code != 0 || res.stdout != want.String() {
				t.Errorf("logs -f: exit %d, %d bytes of %d, stderr %q\nhead %q", res.code, len(res.stdout), want.Len(), res.stderr, res.stdout[:min(len(res.stdout), 200)])
			}
		case <-time.After(20 * time.Second):
			t.Fatal("logs -f did not end")
		}
	})
	t.Run("files stay bounded", func(t *testing.T) {
		for _, name := range []string{"chatty", "chatty.1"} {
			fi, err := os.Stat(filepath.Join(p.root, "logs", name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() > max {
				t.Errorf("%s is %d bytes, limit %d", name, fi.Size(), max)
			}
		}
		if _, err := os.Stat(filepath.Join(p.root, "logs", "chatty.2")); err == nil {
			t.Error("more than one old generation kept")
		}
	})
	t.Run("logs reads old and current", func(t *testing.T) {
		res := p.callin(nil, nil, nil, "logs", "chatty")
		if res.code != 0 {
			t.Fatalf("logs: exit %d %q", res.code, res.stderr)
		}
		if len(res.stdout) <= max || !strings.HasSuffix(want.String(), res.stdout) {
			t.Errorf("logs gave %d bytes that are not the tail of the output (old+current):\n%q", len(res.stdout), res.stdout[:min(len(res.stdout), 200)])
		}
	})
}
