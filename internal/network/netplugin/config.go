package netplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"

	"kurma.dev/kurma/internal/network/netconf"
	"kurma.dev/kurma/pkg/kerrors"
)

// MaxConfigSize bounds the config read from stdin.
const MaxConfigSize = 1 << 20

// Config is a parsed network config as add/del/main receive it on stdin.
type Config struct {
	// List is the config as a CNI chain: a single-plugin config becomes a
	// one-element list.
	List *libcni.NetworkConfigList
	// Check runs CNI CHECK right after a successful ADD (config key
	// "check": true); it needs cniVersion 0.4.0 or later.
	Check bool
}

// ParseConfig reads a network config: either one plugin ({"type": ...}) or
// a conflist-style chain ({"plugins": [...]}), with a "name". Kurma's own
// keys (aci, default, containerInterface) are tolerated: the standard
// plugins ignore unknown keys.
func ParseConfig(b []byte) (*Config, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, kerrors.New(kerrors.Invalid, "network config: empty (want JSON on stdin)")
	}
	if len(b) > MaxConfigSize {
		return nil, kerrors.New(kerrors.Invalid, "network config: larger than %d bytes", MaxConfigSize)
	}
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&top); err != nil || top == nil {
		return nil, kerrors.New(kerrors.Invalid, "network config: want a JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, kerrors.New(kerrors.Invalid, "network config: trailing data after the JSON object")
	}
	cfg := &Config{}
	if raw, ok := top["check"]; ok {
		if err := json.Unmarshal(raw, &cfg.Check); err != nil {
			return nil, kerrors.New(kerrors.Invalid, "network config: \"check\" must be true or false")
		}
	}
	var list *libcni.NetworkConfigList
	if _, chained := top["plugins"]; chained {
		l, err := libcni.NetworkConfFromBytes(b)
		if err != nil {
			return nil, kerrors.New(kerrors.Invalid, "network config: %v", err)
		}
		if len(l.Plugins) == 0 {
			return nil, kerrors.New(kerrors.Invalid, "network config: \"plugins\" is empty")
		}
		list = l
	} else {
		pc, err := libcni.NetworkPluginConfFromBytes(b)
		if err != nil {
			return nil, kerrors.New(kerrors.Invalid, "network config: %v", err)
		}
		list = &libcni.NetworkConfigList{
			Name:       pc.Network.Name,
			CNIVersion: pc.Network.CNIVersion,
			Plugins:    []*libcni.PluginConfig{pc},
			Bytes:      b,
		}
	}
	if err := netconf.ValidateName(list.Name); err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	if list.CNIVersion == "" {
		return nil, kerrors.New(kerrors.Invalid, "network config %q: missing \"cniVersion\"", list.Name)
	}
	if _, _, _, err := version.ParseVersion(list.CNIVersion); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "network config %q: cniVersion %q: %v", list.Name, list.CNIVersion, err)
	}
	if gt, _ := version.GreaterThan(list.CNIVersion, version.Current()); gt {
		return nil, kerrors.New(kerrors.Invalid, "network config %q: cniVersion %q is newer than the supported %s", list.Name, list.CNIVersion, version.Current())
	}
	for i, p := range list.Plugins {
		if p.Network == nil || p.Network.Type == "" {
			return nil, kerrors.New(kerrors.Invalid, "network config %q: plugin %d has no \"type\"", list.Name, i)
		}
		if !netconf.IsToken(p.Network.Type, "_.-") {
			return nil, kerrors.New(kerrors.Invalid, "network config %q: plugin type %q is not a plain executable name", list.Name, p.Network.Type)
		}
	}
	if cfg.Check {
		if ok, _ := version.GreaterThanOrEqualTo(list.CNIVersion, "0.4.0"); !ok {
			return nil, kerrors.New(kerrors.Invalid, "network config %q: \"check\" needs cniVersion 0.4.0 or later (have %s)", list.Name, list.CNIVersion)
		}
	}
	cfg.List = list
	return cfg, nil
}

// Types lists the plugin executables the config needs, in chain order.
func (c *Config) Types() []string {
	out := make([]string, 0, len(c.List.Plugins))
	for _, p := range c.List.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}

// Attachment is one pod's attachment to the network: the three arguments of
// add and del.
type Attachment struct {
	// NetNS is the path of the pod's network namespace.
	NetNS string
	// PodUUID keys all state for the pod (CNI_CONTAINERID).
	PodUUID string
	// IfName is the interface inside the pod (CNI_IFNAME).
	IfName string
}

// DefaultIfName is used when add/del get no interface argument (the network
// has no containerInterface).
const DefaultIfName = "eth0"

// ParseArgs reads the command-line arguments of add and del:
// NETNS_PATH POD_UUID [IFNAME].
func ParseArgs(args []string) (Attachment, error) {
	if len(args) < 2 || len(args) > 3 {
		return Attachment{}, kerrors.New(kerrors.Invalid, "usage: add|del NETNS_PATH POD_UUID [IFNAME] (got %d arguments)", len(args))
	}
	a := Attachment{NetNS: args[0], PodUUID: args[1], IfName: DefaultIfName}
	if len(args) == 3 && args[2] != "" {
		a.IfName = args[2]
	}
	if !strings.HasPrefix(a.NetNS, "/") {
		return Attachment{}, kerrors.New(kerrors.Invalid, "netns path %q is not absolute", a.NetNS)
	}
	if len(a.PodUUID) > 128 || !netconf.IsToken(a.PodUUID, "_.-") {
		return Attachment{}, kerrors.New(kerrors.Invalid, "pod UUID %q: want letters, digits, '_', '.', '-' (at most 128)", a.PodUUID)
	}
	if err := netconf.ValidIfName(a.IfName); err != nil {
		return Attachment{}, err
	}
	return a, nil
}

func (a Attachment) runtimeConf() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: a.PodUUID, NetNS: a.NetNS, IfName: a.IfName}
}
