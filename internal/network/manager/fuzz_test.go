package manager_test

import (
	"encoding/json"
	"testing"

	"kurma.dev/kurma/internal/network/manager"
)

// FuzzDecodeAttachments feeds Pod.Networks entries (read back from pod.json
// on restart) to the decoder: it must never panic, and what it accepts has a
// valid network name and interface and encodes back.
func FuzzDecodeAttachments(f *testing.F) {
	for _, s := range []string{
		`{"network":"kurma","interface":"eth0","result":{"cniVersion":"1.0.0","ips":[{"address":"10.220.0.2/16","gateway":"10.220.0.1"}]}}`,
		`{"network":"a"}`,
		`{"network":"","interface":"eth0"}`,
		`{"network":"a","interface":"../x"}`,
		`{"network":"a","interface":"averyveryverylongname"}`,
		`{"network":"a","result":{"ips":[{"address":"bad"}]}}`,
		`[]`, `null`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		atts, err := manager.DecodeAttachments([]json.RawMessage{b})
		if err != nil {
			return
		}
		if len(atts) != 1 || atts[0].Network == "" {
			t.Fatalf("accepted %q as %+v", b, atts)
		}
		if _, err := json.Marshal(atts[0]); err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
	})
}
