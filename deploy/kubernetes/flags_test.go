package kubernetes_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"

	"kurma.dev/kurma/internal/testutil"
	"kurma.dev/kurma/internal/testutil/kubecluster"
)

// TestManifestFlags checks every flag the manifests pass to a Kurma
// binary against that binary's own flag set (its -h output), so a renamed
// or removed flag cannot leave a DaemonSet that crash-loops.
func TestManifestFlags(t *testing.T) {
	dir := filepath.Join(testutil.RepoRoot(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	more, _ := filepath.Glob(filepath.Join(dir, "uninstall", "*.yaml"))
	files = append(files, more...)
	if err != nil || len(more) == 0 {
		t.Fatalf("manifests: %v, %v", files, err)
	}
	helps := map[string]string{}
	checked := 0
	for _, f := range files {
		for _, c := range containers(t, f) {
			if len(c.command) == 0 {
				continue
			}
			bin := filepath.Base(c.command[0])
			if !strings.HasPrefix(bin, "kurma") {
				continue
			}
			help, ok := helps[bin]
			if !ok {
				help = usage(t, bin)
				helps[bin] = help
			}
			for _, a := range append(c.command[1:], c.args...) {
				if !strings.HasPrefix(a, "-") {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !strings.Contains(help, "\n  -"+name+" ") && !strings.Contains(help, "\n  -"+name+"\n") {
					t.Errorf("%s: container %s passes %s, which %s does not define", filepath.Base(f), c.name, a, bin)
				}
				checked++
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d flags found in the manifests: the walk is broken", checked)
	}
}

type container struct {
	name          string
	command, args []string
}

// containers returns the containers and init containers of every
// workload in a manifest file.
func containers(t *testing.T, path string) []container {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []container
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		spec := dig(doc, "spec", "template", "spec")
		for _, key := range []string{"initContainers", "containers"} {
			list, _ := spec[key].([]any)
			for _, x := range list {
				m, _ := x.(map[string]any)
				name, _ := m["name"].(string)
				out = append(out, container{name: name, command: strs(m["command"]), args: strs(m["args"])})
			}
		}
	}
}

func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m, _ = m[k].(map[string]any)
	}
	return m
}

func strs(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// usage is a built binary's flag list (-h; Go's flag package prints it).
func usage(t *testing.T, bin string) string {
	t.Helper()
	path := filepath.Join(kubecluster.BinDir(), bin)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not built (make build): %v", bin, err)
	}
	out, _ := exec.Command(path, "-h").CombinedOutput()
	return "\n" + string(out)
}
