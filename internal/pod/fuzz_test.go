package pod

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// FuzzSpec feeds create-pod specs, as REST bodies carry them, to the
// validation: it must never panic, must categorise its errors, and what it
// accepts must have safe names.
func FuzzSpec(f *testing.F) {
	for _, s := range []string{
		`{"name":"web","apps":[{"image":"docker://busybox"}]}`,
		`{"apps":[{"name":"a","image":"x","mounts":[{"volume":"v","path":"/v"}]}],"volumes":[{"name":"v","kind":"empty"}]}`,
		`{"apps":[{"image":"x"},{"image":"x"}],"networks":["host"]}`,
		`{"name":"../x","apps":[]}`,
		`{"apps":[{"image":"file:///a/B_C.aci","env":[{"name":"A","value":"b"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Spec
		if json.Unmarshal(data, &s) != nil {
			return
		}
		err := validateSpec(&s)
		if err != nil {
			if !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("uncategorised error %v", err)
			}
			return
		}
		if s.Name != "" && !nameRe.MatchString(s.Name) {
			t.Fatalf("accepted pod name %q", s.Name)
		}
		for _, a := range s.Apps {
			if !appc.ValidACName(a.Name) {
				t.Fatalf("accepted app name %q", a.Name)
			}
		}
	})
}

// nameRe is the pod name rule ValidName implements, as a regexp: the
// oracle of FuzzValidName.
var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// FuzzValidName checks ValidName against nameRe.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "a", "web-1", "-a", "a-", "_x", "x_y.z", "é", strings.Repeat("a", 63), strings.Repeat("a", 64), "a b", "a/b", "..", "A.9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidName(s), nameRe.MatchString(s); got != want {
			t.Fatalf("ValidName(%q) = %v, regexp says %v", s, got, want)
		}
	})
}

// FuzzRecord feeds on-disk pod records to the parser recovery trusts.
func FuzzRecord(f *testing.F) {
	const id = "0d6c6f1e-1d52-4b8e-9d0b-0a3b2c1d4e5f"
	f.Add([]byte(`{"pod":{"uuid":"` + id + `","state":"running","stagerPID":12},"stagerStart":5,"cgroups":["/sys/fs/cgroup/pids/kurma/` + id + `"]}`))
	f.Add([]byte(`{"pod":{"uuid":"` + id + `","state":"exited"},"volumes":"/var/lib/kurma/volumes/` + id + `"}`))
	f.Add([]byte(`{"pod":{"uuid":"x"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := parseRecord(data, id)
		if err != nil {
			return
		}
		for _, cg := range rec.Cgroups {
			if len(cg) < len(id) || cg[len(cg)-len(id):] != id {
				t.Fatalf("accepted cgroup %q", cg)
			}
		}
	})
}

// FuzzStat feeds /proc/<pid>/stat contents to the start-time parser.
func FuzzStat(f *testing.F) {
	f.Add([]byte("1234 (sle ep) S 1 1234 1234 0 -1 4194560 98 0 0 0 0 0 0 0 20 0 1 0 5821 2277376 129 18446744073709551615"))
	f.Add([]byte("1 ((a)) Z 0"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseStat(data)
		_, _ = parseExiting(data)
	})
}

func TestParseExiting(t *testing.T) {
	tests := []struct {
		in      string
		want    bool
		wantErr bool
	}{
		{"1234 (sle) ep) S 1 1234 1234 0 -1 4194560 98 0 0", false, false},
		{"1234 (x) R 1 1234 1234 0 -1 4194564 98 0 0", true, false}, // PF_EXITING
		{"1234 (x) Z 1 1234 1234 0 -1 4194560 98 0 0", true, false},
		{"1234 (x) S 1 1234 1234 0 -1 -4 98", false, true},
		{"1234 (x) S 1", false, true},
		{"garbage", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.in[:min(len(tc.in), 14)], func(t *testing.T) {
			got, err := parseExiting([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseExiting = %v, %v", got, err)
			}
		})
	}
	// A live process is not exiting; a reaped one is gone.
	if procExiting(os.Getpid()) {
		t.Error("this process reported exiting")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if !procExiting(cmd.Process.Pid) {
		t.Error("a reaped process reported alive")
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"1234 (sle) ep) S 1 1234 1234 0 -1 4194560 98 0 0 0 0 0 0 0 20 0 1 0 5821 2277376 129", 5821, false},
		{"1234 (x) Z 1 1234 1234 0 -1 4194560 98 0 0 0 0 0 0 0 20 0 1 0 5821 2277376 129", 0, true},
		{"1234 (x) S 1", 0, true},
		{"garbage", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in[:min(len(tc.in), 14)], func(t *testing.T) {
			got, err := parseStat([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseStat = %d, %v", got, err)
			}
		})
	}
}

func TestParseRecordRejects(t *testing.T) {
	const id = "0d6c6f1e-1d52-4b8e-9d0b-0a3b2c1d4e5f"
	for name, in := range map[string]string{
		"other uuid":     `{"pod":{"uuid":"x","state":"running"}}`,
		"bad state":      `{"pod":{"uuid":"` + id + `","state":"zombie"}}`,
		"foreign cgroup": `{"pod":{"uuid":"` + id + `","state":"running"},"cgroups":["/sys/fs/cgroup/pids"]}`,
		"escaping cg":    `{"pod":{"uuid":"` + id + `","state":"running"},"cgroups":["/sys/fs/cgroup/../../etc/` + id + `"]}`,
		"foreign vols":   `{"pod":{"uuid":"` + id + `","state":"exited"},"volumes":"/"}`,
		"not json":       `{`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseRecord([]byte(in), id); err == nil {
				t.Error("accepted")
			}
		})
	}
}
