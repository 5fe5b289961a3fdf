package main

import (
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/pkg/appc"
)

type buildFlags struct {
	name, exec, user, group, workdir string
	labels, envs, adds, deps, ports  multi
	annotations                      multi
}

func (b *buildFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.name, "name", "", "image name")
	fs.StringVar(&b.exec, "exec", "", "command line (split on spaces)")
	fs.StringVar(&b.user, "user", "0", "user")
	fs.StringVar(&b.group, "group", "0", "group")
	fs.StringVar(&b.workdir, "workdir", "", "working directory")
	fs.Var(&b.labels, "label", "label k=v (repeatable)")
	fs.Var(&b.annotations, "annotation", "annotation k=v (repeatable)")
	fs.Var(&b.envs, "env", "environment K=V (repeatable)")
	fs.Var(&b.adds, "add", "SRC:DST to copy into the root filesystem (repeatable)")
	fs.Var(&b.deps, "dep", "dependency image ID or name (repeatable)")
	fs.Var(&b.ports, "port", "NAME:PROTO:PORT (repeatable)")
}

func (b *buildFlags) manifest() (appc.ImageManifest, error) {
	m := appc.ImageManifest{ACKind: appc.KindImageManifest, ACVersion: appc.ACVersion, Name: b.name}
	if b.name == "" {
		return m, errors.New("--name is required")
	}
	for _, l := range b.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return m, fmt.Errorf("--label %q: want k=v", l)
		}
		m.Labels = append(m.Labels, appc.Label{Name: k, Value: v})
	}
	for _, a := range b.annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return m, fmt.Errorf("--annotation %q: want k=v", a)
		}
		m.Annotations = append(m.Annotations, appc.Annotation{Name: k, Value: v})
	}
	for _, d := range b.deps {
		if appc.ValidImageID(d) {
			m.Dependencies = append(m.Dependencies, appc.Dependency{ImageName: d, ImageID: d})
		} else {
			m.Dependencies = append(m.Dependencies, appc.Dependency{ImageName: d})
		}
	}
	if b.exec != "" || len(b.envs) > 0 || b.workdir != "" || len(b.ports) > 0 {
		app := &appc.App{Exec: strings.Fields(b.exec), User: b.user, Group: b.group, WorkingDirectory: b.workdir}
		for _, e := range b.envs {
			k, v, ok := strings.Cut(e, "=")
			if !ok {
				return m, fmt.Errorf("--env %q: want K=V", e)
			}
			app.Environment = append(app.Environment, appc.EnvVar{Name: k, Value: v})
		}
		for _, p := range b.ports {
			f := strings.Split(p, ":")
			if len(f) != 3 {
				return m, fmt.Errorf("--port %q: want NAME:PROTO:PORT", p)
			}
			n, err := strconv.ParseUint(f[2], 10, 16)
			if err != nil {
				return m, fmt.Errorf("--port %q: %w", p, err)
			}
			app.Ports = append(app.Ports, appc.Port{Name: f[0], Protocol: f[1], Port: uint(n)})
		}
		m.App = app
	}
	return m, m.Validate()
}

func (b *buildFlags) addAll(bld *acibuild.Builder) error {
	for _, a := range b.adds {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || dst == "" {
			return fmt.Errorf("--add %q: want SRC:DST", a)
		}
		if err := bld.Add(src, dst); err != nil {
			return err
		}
	}
	return nil
}

func build(args []string, stdout io.Writer) (retErr error) {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	var bf buildFlags
	bf.register(fs)
	out := fs.String("o", "", "output .aci")
	gz := fs.Bool("gzip", false, "gzip the ACI")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("build: -o OUT.aci is required")
	}
	m, err := bf.manifest()
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".acbuild-")
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	defer func() {
		tmp.Close()
		if retErr != nil {
			os.Remove(tmp.Name())
		}
	}()
	var w io.Writer = tmp
	var zw *gzip.Writer
	if *gz {
		zw = gzip.NewWriter(tmp)
		w = zw
	}
	bld, err := acibuild.NewACI(w, m)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := bf.addAll(bld); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := bld.Close(); err != nil {
		return err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return fmt.Errorf("build: %w", err)
		}
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	id, err := acibuild.ImageIDFile(*out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, id)
	return err
}
