package cnid

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

// record is one attachment: a sandbox's interface holding a port.
type record struct {
	ContainerID string `json:"container_id"`
	IfName      string `json:"ifname"`
	NetNS       string `json:"netns"`
	PortID      string `json:"port_id"`
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	PodUID      string `json:"pod_uid"`
}

func (r *record) key() string { return r.ContainerID + "_" + r.IfName }

// validContainerID checks a CNI_CONTAINERID before it becomes a file
// name.
func validContainerID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return kerrors.New(kerrors.Invalid, "CNI_CONTAINERID %q: want 1-128 letters, digits, '.', '-', '_'", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-_", c)) {
			return kerrors.New(kerrors.Invalid, "CNI_CONTAINERID %q: want 1-128 letters, digits, '.', '-', '_'", id)
		}
	}
	return nil
}

// store keeps records as files <dir>/<container>_<ifname>.json.
type store struct{ dir string }

func (s store) path(key string) string { return filepath.Join(s.dir, key+".json") }

func (s store) save(r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := s.path(r.key()) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save attachment: %w", err)
	}
	if err := os.Rename(tmp, s.path(r.key())); err != nil {
		return fmt.Errorf("save attachment: %w", err)
	}
	return nil
}

func (s store) remove(key string) error {
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove attachment: %w", err)
	}
	return nil
}

// load reads every record; unreadable files are reported and skipped.
func (s store) load() (map[string]*record, []error) {
	out := map[string]*record{}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return out, []error{err}
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(s.dir, name))
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, name))
		var r record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.key()+".json" != name || r.PortID == "" {
			errs = append(errs, fmt.Errorf("attachment %s: unreadable (%v)", name, err))
			continue
		}
		out[r.key()] = &r
	}
	return out, errs
}

// PodNetNS returns the network namespace of a pod's attachment among the
// records in dir (the agent's --state-dir/k8s), for tools and tests. It
// only reads: unlike load, it leaves a record being written alone.
func PodNetNS(dir, podUID string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("attachments: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var r record
		if err == nil && json.Unmarshal(b, &r) == nil && r.PodUID == podUID {
			return r.NetNS, nil
		}
	}
	return "", kerrors.New(kerrors.NotFound, "no attachment of pod %s in %s", podUID, dir)
}
