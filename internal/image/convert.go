package image

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// maxManifestSize bounds an ACI manifest read from outside.
const maxManifestSize = 1 << 20

// ParseACIManifest parses and validates an ACI's image manifest.
func ParseACIManifest(data []byte) (appc.ImageManifest, error) {
	var m appc.ImageManifest
	if len(data) > maxManifestSize {
		return m, errf(kerrors.Invalid, "ACI manifest larger than %d bytes", maxManifestSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		return m, errf(kerrors.Invalid, "parse ACI manifest: %v", err)
	}
	if dec.More() {
		return m, errf(kerrors.Invalid, "parse ACI manifest: trailing data")
	}
	if err := m.Validate(); err != nil {
		return m, errf(kerrors.Invalid, "ACI manifest: %v", err)
	}
	return m, nil
}

// Annotation and label names the conversion writes.
const (
	AnnotationSource = "kurma.dev/source"
	AnnotationDiffID = "kurma.dev/oci-diffid"
)

// ConvertOCIConfig builds the appc manifest of an OCI image from its config:
// exec = Entrypoint+Cmd, environment, user/group from "uid:gid" (a missing
// group is "0", a missing user "0"), working directory, ports from
// ExposedPorts, labels os/arch/version (= tag), the config's labels and the
// source as annotations. Dependencies are left to the caller.
func ConvertOCIConfig(cf *v1.ConfigFile, name, tag, source string) (appc.ImageManifest, error) {
	m := appc.ImageManifest{ACKind: appc.KindImageManifest, ACVersion: appc.ACVersion, Name: name}
	if cf == nil {
		return m, errf(kerrors.Invalid, "OCI image has no config")
	}
	if name == "" {
		return m, errf(kerrors.Invalid, "OCI image has no name")
	}
	c := cf.Config
	app := &appc.App{WorkingDirectory: c.WorkingDir}
	app.Exec = append(slices.Clone(c.Entrypoint), c.Cmd...)
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !appc.ValidEnvName(k) {
			return m, errf(kerrors.Invalid, "OCI config: bad environment entry %q", kv)
		}
		app.Environment = append(app.Environment, appc.EnvVar{Name: k, Value: v})
	}
	app.User, app.Group = "0", "0"
	if c.User != "" {
		u, g, hasGroup := strings.Cut(c.User, ":")
		if u == "" || (hasGroup && g == "") || strings.ContainsAny(c.User, "\x00/") {
			return m, errf(kerrors.Invalid, "OCI config: bad user %q", c.User)
		}
		app.User = u
		if hasGroup {
			app.Group = g
		}
	}
	if app.WorkingDirectory != "" && !strings.HasPrefix(app.WorkingDirectory, "/") {
		return m, errf(kerrors.Invalid, "OCI config: working directory %q is not absolute", app.WorkingDirectory)
	}
	ports := make([]string, 0, len(c.ExposedPorts))
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	sort.Strings(ports)
	for _, p := range ports {
		num, proto, ok := strings.Cut(p, "/")
		if !ok {
			proto = "tcp"
		}
		proto = strings.ToLower(proto)
		n, err := strconv.ParseUint(num, 10, 16)
		if err != nil || n == 0 || (proto != "tcp" && proto != "udp" && proto != "sctp") {
			return m, errf(kerrors.Invalid, "OCI config: bad exposed port %q", p)
		}
		app.Ports = append(app.Ports, appc.Port{Name: fmt.Sprintf("%s-%d", proto, n), Protocol: proto, Port: uint(n)})
	}
	if len(app.Exec) > 0 || app.WorkingDirectory != "" || len(app.Environment) > 0 || c.User != "" || len(app.Ports) > 0 {
		m.App = app
	}
	if cf.OS != "" {
		m.Labels = append(m.Labels, appc.Label{Name: "os", Value: cf.OS})
	}
	if cf.Architecture != "" {
		m.Labels = append(m.Labels, appc.Label{Name: "arch", Value: cf.Architecture})
	}
	if tag != "" {
		m.Labels = append(m.Labels, appc.Label{Name: "version", Value: tag})
	}
	keys := make([]string, 0, len(c.Labels))
	for k := range c.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		m.Annotations = append(m.Annotations, appc.Annotation{Name: k, Value: c.Labels[k]})
	}
	if source != "" {
		m.Annotations = append(m.Annotations, appc.Annotation{Name: AnnotationSource, Value: source})
	}
	if err := m.Validate(); err != nil {
		return m, errf(kerrors.Invalid, "converted manifest: %v", err)
	}
	return m, nil
}
