package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// addCall is one CNI call as cnitimer logged it.
type addCall struct {
	container string
	start     time.Time
	dur       time.Duration
}

// readCalls returns the successful calls of command in a cnitimer log.
func readCalls(path, command string) []addCall {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []addCall
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) != 5 || fs[0] != command || fs[4] != "0" {
			continue
		}
		at, err1 := strconv.ParseInt(fs[2], 10, 64)
		ns, err2 := strconv.ParseInt(fs[3], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, addCall{container: fs[1], start: time.Unix(0, at), dur: time.Duration(ns)})
	}
	return out
}

// daemonAdd is one successful ADD as the agent's CNI daemon logged it
// ("cnid: ADD", internal/kube/cnid): its phases inside the daemon.
type daemonAdd struct {
	pod                                    string
	read, annotation, policy, attach, took time.Duration
	inflight                               int
}

var kvRE = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// readDaemonAdds parses the agent log's "cnid: ADD" lines, by container.
func readDaemonAdds(path string) map[string]daemonAdd {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]daemonAdd{}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		l := s.Text()
		if !strings.Contains(l, `msg="cnid: ADD"`) {
			continue
		}
		kv := map[string]string{}
		for _, m := range kvRE.FindAllStringSubmatch(l, -1) {
			kv[m[1]] = m[2]
		}
		dur := func(k string) time.Duration {
			d, _ := time.ParseDuration(kv[k])
			return d
		}
		n, _ := strconv.Atoi(kv["inflight"])
		out[kv["container"]] = daemonAdd{pod: kv["pod"], read: dur("read"), annotation: dur("annotation"),
			policy: dur("policy"), attach: dur("attach"), took: dur("took"), inflight: n}
	}
	return out
}

// addStep is one ADD of the burst with the daemon's split and the pod's
// times as the benchmark saw them through the API.
type addStep struct {
	pod       string
	created   time.Time // create returned
	annotated time.Time // annotation first seen on the bench's watch (zero: not seen)
	call      addCall
	d         daemonAdd
}

// outside is the part of the ADD not spent in the daemon's handler: the
// shim's exec and start, the connection and its wait for a serving slot,
// the answer's way back.
func (s addStep) outside() time.Duration { return s.call.dur - s.d.took - s.d.read }

// timeline joins the burst's ADD calls (cnitimer) with the daemon's log
// lines (by container id) and the pods' create and annotation times (by
// pod name).
func timeline(calls []addCall, adds map[string]daemonAdd, created, annotated map[string]time.Time) []addStep {
	var out []addStep
	for _, c := range calls {
		d, ok := adds[c.container]
		if !ok {
			continue
		}
		_, name, _ := strings.Cut(d.pod, "/")
		cr, ok := created[name]
		if !ok {
			continue // not a pod of the burst
		}
		out = append(out, addStep{pod: name, created: cr, annotated: annotated[name], call: c, d: d})
	}
	return out
}

// printTimeline prints the percentiles of each step of the burst's ADDs
// and the timelines of the slowest three.
func printTimeline(steps []addStep) {
	if len(steps) == 0 {
		fmt.Println("  ADD timeline: no ADD joined (agent log or cnitimer lines missing)")
		return
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	row := func(name string, f func(addStep) time.Duration) {
		var ds []time.Duration
		for _, s := range steps {
			ds = append(ds, f(s))
		}
		fmt.Printf("    %-40s %8s %8s %8s %8s\n", name, ms(pct(ds, 50)), ms(pct(ds, 90)), ms(pct(ds, 99)), ms(pct(ds, 100)))
	}
	late, maxIn := 0, 0
	for _, s := range steps {
		if s.annotated.IsZero() || s.annotated.After(s.call.start) {
			late++
		}
		maxIn = max(maxIn, s.d.inflight)
	}
	fmt.Printf("  ADD timeline of %d ADDs (ms; annotation seen after the ADD began: %d; most requests in the daemon at once: %d):\n",
		len(steps), late, maxIn)
	fmt.Printf("    %-40s %8s %8s %8s %8s\n", "", "p50", "p90", "p99", "max")
	row("pod created → annotation seen (API)", func(s addStep) time.Duration {
		if s.annotated.IsZero() {
			return 0
		}
		return s.annotated.Sub(s.created)
	})
	row("pod created → ADD begins", func(s addStep) time.Duration { return s.call.start.Sub(s.created) })
	row("ADD (cnitimer)", func(s addStep) time.Duration { return s.call.dur })
	row("  outside the daemon (exec, connect)", addStep.outside)
	row("  daemon: request read", func(s addStep) time.Duration { return s.d.read })
	row("  daemon: annotation wait", func(s addStep) time.Duration { return s.d.annotation })
	row("  daemon: policy wait", func(s addStep) time.Duration { return s.d.policy })
	row("  daemon: attach (agent plug)", func(s addStep) time.Duration { return s.d.attach })
	row("  daemon: whole handler", func(s addStep) time.Duration { return s.d.took })
	slow := slices.Clone(steps)
	slices.SortFunc(slow, func(a, b addStep) int { return int(b.call.dur - a.call.dur) })
	for _, s := range slow[:min(3, len(slow))] {
		ann := "not seen"
		if !s.annotated.IsZero() {
			ann = "+" + ms(s.annotated.Sub(s.created))
		}
		fmt.Printf("    slow ADD %s: created 0, annotated %s, ADD +%s for %s (outside %s, read %s, annotation %s, policy %s, attach %s; %d in the daemon)\n",
			s.pod, ann, ms(s.call.start.Sub(s.created)), ms(s.call.dur), ms(s.outside()), ms(s.d.read),
			ms(s.d.annotation), ms(s.d.policy), ms(s.d.attach), s.d.inflight)
	}
}

// agentLog is the kurma agent's log in a cluster folder.
func agentLog(clusterDir string) string { return filepath.Join(clusterDir, "logs", "kurma-agent.log") }
