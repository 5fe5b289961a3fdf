package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A report as ginkgo v2 writes it: the suite's set-up nodes, specs that
// passed, failed, were skipped by the suite at run time, or were not
// selected by the focus.
const sampleJUnit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="3" errors="0" failures="1" time="10">
  <testsuite name="Kubernetes e2e suite" package="/x" tests="5" disabled="3" skipped="0" errors="0" failures="1" time="10">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.5"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.25"></testcase>
    <testcase name="[It] [sig-network] Services should be able to create a functioning NodePort service [Conformance]" classname="Kubernetes e2e suite" status="failed" time="120">
      <failure message="service is not reachable within 2m0s timeout on endpoint 10.253.0.1:31234&#xA;more" type="failed">full text</failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work after restarting kube-proxy [Disruptive]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped>
    </testcase>
    <testcase name="[It] [sig-storage] unrelated" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

func TestReadJUnit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(p, []byte(sampleJUnit), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readJUnit(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, state, msg string }{
		{"[sig-network] DNS should provide DNS for services  [Conformance]", "passed", ""},
		{"[sig-network] Services should be able to create a functioning NodePort service [Conformance]", "failed",
			"service is not reachable within 2m0s timeout on endpoint 10.253.0.1:31234"},
		{"[sig-network] Services should work after restarting kube-proxy [Disruptive]", "skipped",
			"skipped - Requires at least 2 nodes (not 1)"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d results %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].Name != w.name || got[i].State != w.state || got[i].Message != w.msg {
			t.Errorf("result %d: got %+v, want %+v", i, got[i], w)
		}
	}
	run := Run{Peer: Kurma, Set: Sets["conformance"], Results: got}
	tab := table([]Run{run})
	for _, s := range []string{"| spec | kurma |", "kurma (conformance): 1 passed, 1 failed, 1 skipped", "FAIL kurma: [sig-network] Services"} {
		if !strings.Contains(tab, s) {
			t.Errorf("table lacks %q:\n%s", s, tab)
		}
	}
	if _, err := readJUnit(filepath.Join(t.TempDir(), "none.xml")); err == nil {
		t.Error("a missing report is not an error")
	}
}
