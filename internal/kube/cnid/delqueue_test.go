package cnid

import (
	"encoding/json"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/kube/cniwire"
)

func queued(env map[string]string) []byte {
	b, _ := json.Marshal(cniwire.Request{Env: env, Stdin: []byte(`{"cniVersion":"1.1.0","name":"kurma","type":"kurma-k8s"}`)})
	return b
}

func TestParseQueued(t *testing.T) {
	del := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "abc123", "CNI_IFNAME": "eth0"}
	add := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_IFNAME": "eth0"}
	bad := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "../x", "CNI_IFNAME": "eth0"}
	for _, c := range []struct {
		name, file string
		b          []byte
		err        string
	}{
		{"a DEL", "abc123_eth0.json", queued(del), ""},
		{"not JSON", "abc123_eth0.json", []byte("{"), "decode"},
		{"an ADD", "abc123_eth0.json", queued(add), "want DEL"},
		{"another container's file", "other_eth0.json", queued(del), "do not match"},
		{"unsafe container id", "../x_eth0.json", queued(bad), "do not match"},
		{"too big", "abc123_eth0.json", make([]byte, cniwire.MaxMessage+1), "over"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := parseQueued(c.file, c.b)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.err == "" && req.Env["CNI_CONTAINERID"] != "abc123":
				t.Fatalf("request %+v", req)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one with %q", err, c.err)
			}
		})
	}
}

// FuzzParseQueued: whatever a queue file holds, a request comes back only
// when it is a DEL for the container and interface of the file's name.
func FuzzParseQueued(f *testing.F) {
	f.Add("abc_eth0.json", string(queued(map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "abc", "CNI_IFNAME": "eth0"})))
	f.Add("x_eth0.json", `{"env":{"CNI_COMMAND":"DEL"}}`)
	f.Add("", `null`)
	f.Fuzz(func(t *testing.T, name, body string) {
		req, err := parseQueued(name, []byte(body))
		if err != nil {
			return
		}
		if req.Env["CNI_COMMAND"] != "DEL" || cniwire.QueueFile(req.Env["CNI_CONTAINERID"], req.Env["CNI_IFNAME"]) != name {
			t.Fatalf("accepted %q for file %q", body, name)
		}
	})
}
