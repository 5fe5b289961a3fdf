package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

func TestRun(t *testing.T) {
	t.Setenv("CNI_CONTAINERID", "0123abcd")
	t.Setenv("CNI_IFNAME", "eth0")
	t.Setenv("CNI_NETNS", "/var/run/netns/cni-x")
	for _, tc := range []struct {
		name, cmd, conf string
		code            int
		check           func(t *testing.T, out []byte)
	}{
		{"add 1.0.0", "ADD", `{"cniVersion":"1.0.0","name":"floor","type":"floorcni"}`, 0, func(t *testing.T, out []byte) {
			r, err := version.NewResult("1.0.0", out)
			if err != nil {
				t.Fatalf("result %s: %v", out, err)
			}
			res, err := types100.NewResultFromResult(r)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "eth0" || res.Interfaces[0].Sandbox != "/var/run/netns/cni-x" {
				t.Fatalf("interfaces %+v", res.Interfaces)
			}
			if len(res.IPs) != 1 || res.IPs[0].Address.IP.To4() == nil || res.IPs[0].Address.IP[12] != 10 ||
				res.IPs[0].Interface == nil || *res.IPs[0].Interface != 0 {
				t.Fatalf("ips %+v", res.IPs)
			}
		}},
		{"add 0.4.0", "ADD", `{"cniVersion":"0.4.0","name":"floor","type":"floorcni"}`, 0, func(t *testing.T, out []byte) {
			if _, err := version.NewResult("0.4.0", out); err != nil {
				t.Fatalf("result %s: %v", out, err)
			}
		}},
		{"del", "DEL", `{"cniVersion":"1.0.0","name":"floor","type":"floorcni"}`, 0, nil},
		{"check", "CHECK", `{"cniVersion":"1.0.0","name":"floor","type":"floorcni"}`, 0, nil},
		{"bad version", "ADD", `{"cniVersion":"9.9.9","name":"floor","type":"floorcni"}`, 1, nil},
		{"bad json", "ADD", `{`, 1, func(t *testing.T, out []byte) {
			var e types.Error
			if err := jsonErr(out, &e); err != nil || e.Code != types.ErrDecodingFailure {
				t.Fatalf("error %s: %v", out, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := run(tc.cmd, strings.NewReader(tc.conf))
			if code != tc.code {
				t.Fatalf("code %d, want %d (%s)", code, tc.code, out)
			}
			if tc.check != nil {
				tc.check(t, out)
			}
		})
	}
}

func TestAddressesDiffer(t *testing.T) {
	seen := map[string]string{}
	for i := range 100 {
		id := strings.Repeat("c", 60) + string(rune('a'+i%26)) + string(rune('a'+i/26))
		t.Setenv("CNI_CONTAINERID", id)
		t.Setenv("CNI_IFNAME", "eth0")
		t.Setenv("CNI_NETNS", "/x")
		_, out := run("ADD", strings.NewReader(`{"cniVersion":"1.0.0"}`))
		r, err := version.NewResult("1.0.0", out)
		if err != nil {
			t.Fatal(err)
		}
		res, _ := types100.NewResultFromResult(r)
		a := res.IPs[0].Address.IP.String()
		if o, dup := seen[a]; dup {
			t.Fatalf("%s and %s both got %s", o, id, a)
		}
		seen[a] = id
	}
}

func jsonErr(b []byte, e *types.Error) error { return json.Unmarshal(b, e) }
