package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/internal/pod/podtypes"
	"kurma.dev/kurma/pkg/kerrors"
)

// maxSpecBytes bounds a pod spec file.
const maxSpecBytes = 1 << 20

// ParseSpec reads a pod spec (the API's podtypes.Spec) written in YAML or JSON.
// Unknown fields are refused; the spec is checked like the API does.
func ParseSpec(data []byte) (podtypes.Spec, error) {
	var spec podtypes.Spec
	if len(data) > maxSpecBytes {
		return spec, kerrors.New(kerrors.Invalid, "pod spec larger than %d bytes", maxSpecBytes)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return spec, kerrors.New(kerrors.Invalid, "pod spec is not YAML or JSON: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return podtypes.Spec{}, kerrors.New(kerrors.Invalid, "pod spec: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return podtypes.Spec{}, kerrors.New(kerrors.Invalid, "pod spec: trailing data")
	}
	if err := wire.ValidateSpec(&spec); err != nil {
		return podtypes.Spec{}, err
	}
	return spec, nil
}

func newCreateCmd(e *env) *cobra.Command {
	var file, name string
	cmd := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Create and start a pod from a spec file (YAML or JSON; - for stdin)",
		Long: `Create and start a pod described by a spec file, which may hold several
apps and volumes:

  name: web
  volumes: [{name: shared, kind: empty}]
  apps:
  - name: a
    image: docker://registry/busybox:latest
    exec: [sleep, "3600"]
    mounts: [{volume: shared, path: /shared}]

It prints the pod's UUID.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return kerrors.New(kerrors.Invalid, "create needs -f FILE")
			}
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(io.LimitReader(e.stdin, maxSpecBytes+1))
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("read pod spec: %w", err)
			}
			spec, err := ParseSpec(data)
			if err != nil {
				return err
			}
			if name != "" {
				spec.Name = name
			}
			c := e.client()
			defer c.Close()
			p, err := c.CreatePod(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if e.json {
				return printJSON(e.stdout, p)
			}
			fmt.Fprintln(e.stdout, p.UUID)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "pod spec file (YAML or JSON), - for stdin")
	cmd.Flags().StringVar(&name, "name", "", "override the spec's pod name")
	return cmd
}
