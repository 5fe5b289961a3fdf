package stager

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"kurma.dev/kurma/pkg/kerrors"
	"kurma.dev/kurma/pkg/stagerspec"
)

// State is what StatePath holds: the last status init recorded.
type State struct {
	Apps stagerspec.Status `json:"apps"`
}

func writeStateFile(path string, st stagerspec.Status) error {
	b, err := json.MarshalIndent(State{Apps: st}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("replace state: %w", err)
	}
	return nil
}

func readStateFile(path string) (stagerspec.Status, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, kerrors.New(kerrors.NotFound, "read state: %v", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "decode state: %v", err)
	}
	return s.Apps, nil
}
