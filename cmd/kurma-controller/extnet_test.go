package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
)

func TestExternalNetworkCommand(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, addr := start(t, "--listen", "127.0.0.1:0", "--token-file", tok, "--store", "bolt:"+filepath.Join(dir, "db"))
	url := "http://" + addr
	ctx := context.Background()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := externalNetworkCmd(ctx, args, &out)
		return out.String(), err
	}
	out, err := run("create", "public", "--cidr", "198.51.100.0/24", "--pool", "198.51.100.10-198.51.100.20",
		"--controller", url, "--token-file", tok)
	if err != nil {
		t.Fatal(err)
	}
	var n capi.ExternalNetwork
	if err := json.Unmarshal([]byte(out), &n); err != nil || n.ID != "public" || n.CIDR != "198.51.100.0/24" ||
		len(n.AllocationPools) != 1 || n.AllocationPools[0].End != "198.51.100.20" {
		t.Fatalf("create printed %q (%v)", out, err)
	}
	if out, err = run("list", "--controller", url, "--token-file", tok); err != nil || !strings.Contains(out, `"public"`) {
		t.Fatalf("list: %q %v", out, err)
	}
	// A wrong token, bad input and an unknown verb are errors.
	if _, err := run("list", "--controller", url); err == nil {
		t.Fatal("list without token: no error")
	}
	for _, args := range [][]string{{"create", "x"}, {"create", "x", "--cidr", "10.0.0.0/24", "--pool", "10.0.0.5"},
		{"frobnicate"}, {}, {"delete"}, {"list", "extra"}} {
		if _, err := run(append(args, "--controller", url, "--token-file", tok)...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := run("delete", "public", "--controller", url, "--token-file", tok); err != nil {
		t.Fatal(err)
	}
	if out, err = run("list", "--controller", url, "--token-file", tok); err != nil || strings.Contains(out, `"public"`) {
		t.Fatalf("list after delete: %q %v", out, err)
	}
}
