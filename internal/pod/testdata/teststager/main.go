// Command teststager is a small, real stager used by the pod manager's
// tests. Its behaviour is chosen by stagerConfig.mode in /manifest:
// "normal" (ready, then wait for SIGTERM), "never-ready", "exit-after-ready"
// (exit 3 soon after readiness), "fail" (exit 2 before readiness),
// "with-child" (leaves a TERM-proof child), "ignore-term". Pre-started
// (KURMA_STAGER_GO_FD set), it waits for the go-ahead first and sets the
// hostname itself. It
// records what it found in its root in /state.json. Called as
// /opt/stager/{status,run,logs,attach} it serves the call-ins.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

type manifest struct {
	Name string `json:"name"`
	Pod  struct {
		Apps []struct {
			Name string `json:"name"`
		} `json:"apps"`
		Volumes []struct {
			Name string `json:"name"`
		} `json:"volumes"`
	} `json:"pod"`
	AppImageOrder map[string][]string `json:"appImageOrder"`
	StagerConfig  struct {
		Mode string `json:"mode"`
	} `json:"stagerConfig"`
}

type state struct {
	PID          int             `json:"pid"`
	LayersRO     map[string]bool `json:"layersRO"`
	Volumes      map[string]bool `json:"volumes"`
	Proc         bool            `json:"proc"`
	SysRO        bool            `json:"sysRO"`
	CgroupOwn    bool            `json:"cgroupOwn"`
	Hostname     string          `json:"hostname"`
	Interfaces   []string        `json:"interfaces"`
	ManifestName string          `json:"manifestName"`
}

func readManifest() (*manifest, error) {
	b, err := os.ReadFile("/manifest")
	if err != nil {
		return nil, err
	}
	var m manifest
	return &m, json.Unmarshal(b, &m)
}

func main() {
	switch filepath.Base(os.Args[0]) {
	case "status":
		m, err := readManifest()
		if err != nil {
			fail(err)
		}
		out := map[string]any{}
		for _, a := range m.Pod.Apps {
			out[a.Name] = map[string]any{"pid": 1, "exited": false}
		}
		_ = json.NewEncoder(os.Stdout).Encode(out)
	case "run":
		var s struct {
			Exec []string `json:"exec"`
		}
		f := os.NewFile(3, "settings")
		if err := json.NewDecoder(f).Decode(&s); err != nil {
			fail(err)
		}
		cmd := exec.Command(s.Exec[0], s.Exec[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		if err != nil {
			fail(err)
		}
	case "logs":
		fmt.Printf("log of %s\n", os.Args[1])
		if len(os.Args) > 2 && os.Args[2] == "-f" {
			for i := 0; ; i++ {
				time.Sleep(20 * time.Millisecond)
				if _, err := fmt.Printf("line %d\n", i); err != nil {
					return
				}
			}
		}
	case "attach":
		_, _ = io.Copy(os.Stdout, os.Stdin)
	default:
		stager()
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "teststager:", err)
	os.Exit(1)
}

func stager() {
	syscall.CloseOnExec(4) // children must not hold the readiness pipe
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	prestarted := awaitGoAhead()
	m, err := readManifest()
	if err != nil {
		fail(err)
	}
	if prestarted {
		// The daemon could not name us: the pod did not exist yet.
		_ = syscall.Sethostname([]byte(m.Name))
	}
	st := state{PID: os.Getpid(), LayersRO: map[string]bool{}, Volumes: map[string]bool{}, ManifestName: m.Name}
	for _, order := range m.AppImageOrder {
		for _, id := range order {
			err := os.WriteFile(filepath.Join("/layers", id, "probe"), nil, 0o644)
			st.LayersRO[id] = errors.Is(err, syscall.EROFS)
		}
	}
	for _, v := range m.Pod.Volumes {
		err := os.WriteFile(filepath.Join("/volumes", v.Name, "from-stager"), []byte(m.Name), 0o644)
		st.Volumes[v.Name] = err == nil
	}
	_, err = os.Stat("/proc/self/status")
	st.Proc = err == nil
	err = os.WriteFile("/sys/kernel/probe", nil, 0o644)
	st.SysRO = errors.Is(err, syscall.EROFS)
	// Our own cgroup is writable: we can make a child cgroup in it.
	for _, d := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			if err := os.Mkdir(filepath.Join(d, "sub"), 0o755); err == nil {
				st.CgroupOwn = true
				_ = os.Remove(filepath.Join(d, "sub"))
			}
			break
		}
	}
	st.Hostname, _ = os.Hostname()
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			st.Interfaces = append(st.Interfaces, e.Name())
		}
	}
	b, _ := json.Marshal(&st)
	if err := os.WriteFile("/state.json", b, 0o644); err != nil {
		fail(err)
	}
	ready := os.NewFile(4, "ready")
	switch m.StagerConfig.Mode {
	case "fail":
		os.Exit(2)
	case "never-ready":
		select {}
	case "exit-after-ready":
		ready.Close()
		time.Sleep(300 * time.Millisecond)
		os.Exit(3)
	}
	// A child that must be killed by the teardown (it ignores SIGTERM).
	if m.StagerConfig.Mode == "with-child" {
		c := exec.Command("/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done")
		if err := c.Start(); err != nil {
			fail(err)
		}
	}
	ready.Close()
	if m.StagerConfig.Mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
		select {}
	}
	<-sigs
	os.Exit(0)
}

// awaitGoAhead waits, when pre-started, for the daemon's byte; EOF means
// the daemon let us go. It reports whether we were pre-started.
func awaitGoAhead() bool {
	v := os.Getenv("KURMA_STAGER_GO_FD")
	if v == "" {
		return false
	}
	fd, err := strconv.Atoi(v)
	if err != nil {
		fail(fmt.Errorf("KURMA_STAGER_GO_FD=%q", v))
	}
	f := os.NewFile(uintptr(fd), "go")
	var b [1]byte
	if n, _ := f.Read(b[:]); n != 1 {
		os.Exit(0)
	}
	f.Close()
	return true
}
