package manager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/internal/pod"
	"kurma.dev/kurma/pkg/appc"
)

// HostPrivileged is the label or annotation by which a plugin image
// declares that it needs host privilege.
const HostPrivileged = pod.HostPrivilegedLabel

// IsHostPrivileged reports whether an image manifest declares
// kurma.dev/host-privileged=true, as an annotation or as a label.
func IsHostPrivileged(m appc.ImageManifest) bool { return pod.ImageDeclaresHostPrivilege(m) }

// PrepareHostPlugins is host mode: for each network it pulls the plugin
// image into the store, checks that the image declares host privilege,
// and points c at the image's extracted /opt/network with
// KURMA_CNI_PATH=<rootfs>/opt/cni/bin and KURMA_NETWORK_STATE_DIR=
// <stateDir>/<network>; the network is then Running. A network whose
// image cannot be used is marked Failed with the reason. The plugin's
// add/del then run as host processes, which is what a host-privileged
// plugin container amounts to, without a networking pod.
//
// It then keeps each image's main executable (app.exec, run from the
// extracted root filesystem with the config on stdin) running with a
// HostMain until ctx ends, which drives the network's state.
func PrepareHostPlugins(ctx context.Context, store image.Store, m *Manager, c *HostCaller, stateDir string) {
	for _, n := range m.opts.Networks {
		h, err := prepareHost(ctx, store, c, stateDir, n.Name, n.ACI)
		if err != nil {
			m.log.Error("network plugin unusable", "network", n.Name, "err", err)
			m.SetState(n.Name, Failed, err.Error())
			continue
		}
		h.Manager = m
		go func() { _ = h.Run(ctx) }()
	}
}

func prepareHost(ctx context.Context, store image.Store, c *HostCaller, stateDir, name, aci string) (*HostMain, error) {
	img, err := store.Pull(ctx, aci, image.PullOptions{})
	if err != nil {
		return nil, fmt.Errorf("pull plugin image %s: %w", aci, err)
	}
	if !IsHostPrivileged(img.Manifest) {
		return nil, fmt.Errorf("plugin image %s does not declare %s=true; only the networking pod may run it", aci, HostPrivileged)
	}
	layers, err := store.Resolve(ctx, img.ID)
	if err != nil {
		return nil, fmt.Errorf("resolve plugin image %s: %w", aci, err)
	}
	if len(layers) != 1 || layers[0].Path == "" {
		return nil, fmt.Errorf("plugin image %s: host mode needs a single-layer image (has %d layers)", aci, len(layers))
	}
	root := layers[0].Path
	dir := filepath.Join(root, "opt", "network")
	for _, v := range []string{VerbAdd, VerbDel} {
		if fi, err := os.Stat(filepath.Join(dir, v)); err != nil || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("plugin image %s lacks an executable /opt/network/%s", aci, v)
		}
	}
	state := filepath.Join(stateDir, name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", state, err)
	}
	env := []string{
		"KURMA_CNI_PATH=" + filepath.Join(root, "opt", "cni", "bin"),
		"KURMA_NETWORK_STATE_DIR=" + state,
	}
	c.SetNetwork(name, dir, env)
	app := img.Manifest.App
	if app == nil || len(app.Exec) == 0 || !filepath.IsAbs(app.Exec[0]) {
		return nil, fmt.Errorf("plugin image %s has no absolute app exec (its main executable)", aci)
	}
	argv := append([]string{filepath.Join(root, filepath.Clean(app.Exec[0]))}, app.Exec[1:]...)
	return &HostMain{Network: name, Argv: argv, Env: env}, nil
}
