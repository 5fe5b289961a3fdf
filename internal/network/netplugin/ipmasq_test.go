package netplugin_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/uuid"

	"kurma.dev/kurma/internal/testutil"
)

// nftRuleset lists the nftables ruleset of the test's host namespace.
func (e *env) nftRuleset() string {
	e.t.Helper()
	var out []byte
	err := e.host.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("nft", "list", "ruleset").CombinedOutput()
		return err
	})
	if err != nil {
		e.t.Fatalf("nft list ruleset: %v\n%s", err, out)
	}
	return string(out)
}

// TestIPMasqCleanup checks that the masquerade rules ADD programs (inside
// the test's host namespace, never the real host's) are removed by DEL.
func TestIPMasqCleanup(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (hack/apt-packages.txt lists nftables)")
	}
	e := newEnv(t)
	pod := testutil.NewNetNS(t)
	id := uuid.NewString()
	conf := e.bridgeConf(map[string]any{"ipMasq": true, "ipMasqBackend": "nftables"})
	res := e.mustAdd(conf, pod, id, "eth0")
	ip := res.IPs[0].Address.IP.String()
	if rs := e.nftRuleset(); !strings.Contains(rs, ip) || !strings.Contains(rs, "masquerade") {
		t.Fatalf("no masquerade rule for %s after add:\n%s", ip, rs)
	}
	e.mustDel(conf, pod, id, "eth0")
	if rs := e.nftRuleset(); strings.Contains(rs, ip) {
		t.Fatalf("masquerade rule for %s left after del:\n%s", ip, rs)
	}
}
