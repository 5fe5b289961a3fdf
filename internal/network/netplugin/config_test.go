package netplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name, conf string
		types      []string
		check      bool
		version    string
		wantErr    string
	}{
		{"single", `{"cniVersion":"1.0.0","name":"n","type":"bridge","bridge":"b0"}`, []string{"bridge"}, false, "1.0.0", ""},
		{"chain", `{"cniVersion":"0.4.0","name":"n","check":true,"plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}`,
			[]string{"bridge", "portmap"}, true, "0.4.0", ""},
		{"kurma keys tolerated", `{"cniVersion":"1.0.0","name":"n","type":"bridge","aci":"x","default":true,"containerInterface":"eth0"}`, []string{"bridge"}, false, "1.0.0", ""},
		{"empty", ``, nil, false, "", "empty"},
		{"array", `[]`, nil, false, "", "JSON object"},
		{"trailing", `{"cniVersion":"1.0.0","name":"n","type":"bridge"} x`, nil, false, "", "trailing"},
		{"trailing brace", `{"cniVersion":"1.0.0","name":"n","type":"bridge"}}`, nil, false, "", "trailing"},
		{"no name", `{"cniVersion":"1.0.0","type":"bridge"}`, nil, false, "", "name"},
		{"no version", `{"name":"n","type":"bridge"}`, nil, false, "", "cniVersion"},
		{"bad version", `{"cniVersion":"x.y","name":"n","type":"bridge"}`, nil, false, "", "cniVersion"},
		{"future version", `{"cniVersion":"9.0.0","name":"n","type":"bridge"}`, nil, false, "", "newer"},
		{"no type", `{"cniVersion":"1.0.0","name":"n"}`, nil, false, "", "type"},
		{"path type", `{"cniVersion":"1.0.0","name":"n","type":"/bin/sh"}`, nil, false, "", "plain executable"},
		{"empty chain", `{"cniVersion":"1.0.0","name":"n","plugins":[]}`, nil, false, "", "plugins"},
		{"chain no type", `{"cniVersion":"1.0.0","name":"n","plugins":[{"a":1}]}`, nil, false, "", "type"},
		{"check type", `{"cniVersion":"1.0.0","name":"n","type":"bridge","check":"yes"}`, nil, false, "", "check"},
		{"check old", `{"cniVersion":"0.3.1","name":"n","type":"bridge","check":true}`, nil, false, "", "0.4.0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.conf))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if !errors.Is(err, kerrors.Invalid) {
					t.Errorf("error %v is not Invalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(c.Types()) != fmt.Sprint(tc.types) || c.Check != tc.check || c.List.CNIVersion != tc.version {
				t.Fatalf("got types %v check %v version %q", c.Types(), c.Check, c.List.CNIVersion)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Attachment
		wantErr string
	}{
		{"full", []string{"/proc/1/ns/net", "146d7cef-fbf6-41da-a2f8-eba218597f9c", "net1"}, Attachment{"/proc/1/ns/net", "146d7cef-fbf6-41da-a2f8-eba218597f9c", "net1"}, ""},
		{"no ifname", []string{"/run/netns/x", "pod"}, Attachment{"/run/netns/x", "pod", "eth0"}, ""},
		{"empty ifname", []string{"/run/netns/x", "pod", ""}, Attachment{"/run/netns/x", "pod", "eth0"}, ""},
		{"none", nil, Attachment{}, "usage"},
		{"four", []string{"/a", "b", "c", "d"}, Attachment{}, "usage"},
		{"relative", []string{"a", "b"}, Attachment{}, "absolute"},
		{"pod slash", []string{"/a", "b/c"}, Attachment{}, "pod UUID"},
		{"pod dotdot", []string{"/a", ".."}, Attachment{}, "pod UUID"},
		{"long ifname", []string{"/a", "b", "0123456789abcdef"}, Attachment{}, "longer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestCommand(t *testing.T) {
	tests := []struct {
		argv []string
		cmd  string
		rest int
	}{
		{[]string{"/opt/network/add", "/n", "p", "eth0"}, "add", 3},
		{[]string{"/opt/network/del", "/n", "p"}, "del", 2},
		{[]string{"kurma-netplugin", "check", "/n", "p", "eth0"}, "check", 3},
		{[]string{"/netplugin"}, "main", 0},
		{[]string{"/netplugin", "main"}, "main", 0},
		{nil, "main", 0},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.argv, " "), func(t *testing.T) {
			cmd, rest := command(tc.argv)
			if cmd != tc.cmd || len(rest) != tc.rest {
				t.Fatalf("got %q %v", cmd, rest)
			}
		})
	}
}

func TestToCNIError(t *testing.T) {
	tests := []struct {
		err  error
		code uint
	}{
		{fmt.Errorf("%w: %w", errBadArgs, kerrors.New(kerrors.Invalid, "x")), types.ErrInvalidEnvironmentVariables},
		{fmt.Errorf("wrap: %w", kerrors.New(kerrors.Invalid, "x")), types.ErrInvalidNetworkConfig},
		{kerrors.New(kerrors.Timeout, "x"), types.ErrTryAgainLater},
		{fmt.Errorf("plugin: %w", &types.Error{Code: 3, Msg: "unknown container"}), 3},
		{errors.New("boom"), types.ErrInternal},
	}
	for _, tc := range tests {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := ToCNIError(tc.err); got.Code != tc.code || got.Msg == "" {
				t.Fatalf("got %+v, want code %d", got, tc.code)
			}
		})
	}
}

func TestLockSerialisesAndCleansUp(t *testing.T) {
	p, err := New(Options{StateDir: t.TempDir(), CNIPath: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			l, err := p.lock(ctx, "net", "pod")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			if n > maxInside.Load() {
				maxInside.Store(n)
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			l.unlock(i%2 == 0) // half of the holders unlink the file
		})
	}
	wg.Wait()
	if maxInside.Load() != 1 {
		t.Fatalf("%d holders at once", maxInside.Load())
	}
	// A held lock makes a waiter time out with a Timeout error.
	l, err := p.lock(ctx, "net", "pod")
	if err != nil {
		t.Fatal(err)
	}
	defer l.unlock(true)
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := p.lock(short, "net", "pod"); !errors.Is(err, kerrors.Timeout) {
		t.Fatalf("waiting on a held lock: %v, want Timeout", err)
	}
	// Other pods are not blocked.
	l2, err := p.lock(short, "net", "other")
	if err != nil {
		t.Fatal(err)
	}
	l2.unlock(true)
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","type":"bridge","bridge":"b0","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}`))
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","check":true,"plugins":[{"type":"bridge"},{"type":"tuning"}]}`))
	f.Add([]byte(`{"cniVersion":"1.1.0","cniVersions":["0.4.0","1.0.0"],"name":"n","plugins":[{"type":"x"}]}`))
	f.Add([]byte(`{"name":"n","type":"../x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if len(c.List.Plugins) == 0 || c.List.Name == "" || c.List.CNIVersion == "" {
			t.Fatalf("accepted incomplete config %s", b)
		}
		for _, ty := range c.Types() {
			if ty == "" || strings.ContainsAny(ty, "/\x00") || ty == "." || ty == ".." {
				t.Fatalf("accepted plugin type %q", ty)
			}
		}
	})
}

func FuzzParseArgs(f *testing.F) {
	f.Add("/proc/1/ns/net", "146d7cef-fbf6-41da-a2f8-eba218597f9c", "eth0")
	f.Add("/run/netns/x", "pod", "")
	f.Add("rel", "../x", "a/b")
	f.Fuzz(func(t *testing.T, netns, pod, ifname string) {
		a, err := ParseArgs([]string{netns, pod, ifname})
		if err != nil {
			return
		}
		if strings.ContainsAny(a.PodUUID, "/\x00") || a.PodUUID == ".." || !strings.HasPrefix(a.NetNS, "/") ||
			len(a.IfName) == 0 || len(a.IfName) > 15 || strings.ContainsAny(a.IfName, "/: ") {
			t.Fatalf("accepted %+v", a)
		}
	})
}
