package cniconformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// CNITool runs the pinned upstream cnitool (bin/tools/cnitool) the way an
// operator would: configs in NetConfDir, plugins in Path, one invocation
// per verb. HostNetNS, when set, is the netns path the tool (and so the
// plugins) run in, entered with nsenter.
type CNITool struct {
	Bin        string
	Path       []string
	NetConfDir string
	HostNetNS  string
	Env        []string // extra environment, e.g. CNI_ARGS=...
}

// WriteConf stores a config (conflist when it has "plugins") under name in
// NetConfDir.
func (c *CNITool) WriteConf(name string, conf []byte) error {
	ext := ".conf"
	if bytes.Contains(conf, []byte(`"plugins"`)) {
		ext = ".conflist"
	}
	return os.WriteFile(filepath.Join(c.NetConfDir, name+ext), conf, 0o644)
}

// Run runs `cnitool <verb> <network> <netns>` and returns its stdout.
func (c *CNITool) Run(ctx context.Context, verb, network, netnsPath string) ([]byte, error) {
	args := []string{c.Bin, verb, network, netnsPath}
	if c.HostNetNS != "" {
		args = append([]string{"nsenter", "--net=" + c.HostNetNS}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append([]string{"CNI_PATH=" + strings.Join(c.Path, ":"), "NETCONFPATH=" + c.NetConfDir,
		"PATH=" + os.Getenv("PATH")}, c.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("cnitool %s %s: %w: %s%s", verb, network, err, out.Bytes(), errb.Bytes())
	}
	return out.Bytes(), nil
}
