package stager

import (
	"bytes"
	"encoding/base64"
	"testing"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/stagerspec"
)

// FuzzAppStdin: any annotation value decodes or fails cleanly, and what
// the daemon encodes comes back unchanged.
func FuzzAppStdin(f *testing.F) {
	f.Add("e30K", []byte("{}\n"))
	f.Add("!!", []byte{0, 1, 2})
	f.Add("", []byte(nil))
	f.Fuzz(func(t *testing.T, v string, data []byte) {
		ra := appc.RuntimeApp{Name: "a", Annotations: []appc.Annotation{{Name: stagerspec.StdinAnnotation, Value: v}}}
		_, _ = appStdin(ra)
		ra.Annotations[0].Value = base64.StdEncoding.EncodeToString(data)
		got, err := appStdin(ra)
		if err != nil || !bytes.Equal(got, data) && len(data) > 0 {
			t.Fatalf("round trip %q: %q %v", data, got, err)
		}
	})
}
