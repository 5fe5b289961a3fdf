package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// Leases live apart from index.json, one small file per holder
// (<root>/leases/<holder>: a JSON array of image IDs), written atomically
// (temp file, rename) and not fsynced. They have to outlive kurmad, not the
// machine: a machine that crashes ends the pods that held them. So a pod
// start and removal cost a file write and an unlink instead of a rewrite
// and fsync of the whole index (bench/README.md has the figures). In memory they
// are idx.Leases, which index.json no longer stores; an index of an older
// version that still holds leases has them moved into files on open.

// Lease marks images (IDs, refs or names) as used by holder, so that Remove
// refuses them and everything they stand on. holder must be a plain name
// (a pod UUID, say). A holder's leases add up: leasing again what it holds
// already writes nothing. Leases are persisted.
func (s *FSStore) Lease(ctx context.Context, holder string, ids ...string) error {
	if err := validHolder(holder); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.idx.Leases[holder]
	held := slices.Clone(old)
	for _, id := range ids {
		r, err := s.lookupLocked(id)
		if err != nil {
			return fmt.Errorf("lease %s: %w", holder, err)
		}
		if !slices.Contains(held, r.ID) {
			held = append(held, r.ID)
		}
	}
	if had && len(held) == len(old) {
		return nil // nothing new: its file holds these already
	}
	if err := s.writeLease(holder, held); err != nil {
		return err
	}
	s.idx.Leases[holder] = held
	return nil
}

// Unlease drops every lease of holder; an unknown holder is not an error.
func (s *FSStore) Unlease(ctx context.Context, holder string) error {
	if err := validHolder(holder); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idx.Leases[holder]; !ok {
		return nil
	}
	if err := os.Remove(filepath.Join(s.leasesDir(), holder)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unlease %s: %w", holder, err)
	}
	delete(s.idx.Leases, holder)
	return nil
}

func (s *FSStore) leasesDir() string { return filepath.Join(s.root, "leases") }

// validHolder checks that a lease holder can name a file of its own in
// the leases folder: 1 to 128 letters, digits, '_', '-' or '.', not
// starting with '.' (temp files do).
func validHolder(h string) error {
	if h == "" || len(h) > 128 || h[0] == '.' {
		return errf(kerrors.Invalid, "lease holder %q: use 1 to 128 letters, digits, '_', '-', '.', not starting with '.'", h)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return errf(kerrors.Invalid, "lease holder %q: use 1 to 128 letters, digits, '_', '-', '.', not starting with '.'", h)
		}
	}
	return nil
}

// writeLease stores holder's lease file atomically, without fsync (see
// the top of this file).
func (s *FSStore) writeLease(holder string, ids []string) error {
	b, err := json.Marshal(ids)
	if err != nil {
		return fmt.Errorf("encode lease %s: %w", holder, err)
	}
	tmp := filepath.Join(s.leasesDir(), "."+holder+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write lease %s: %w", holder, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.leasesDir(), holder)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write lease %s: %w", holder, err)
	}
	return nil
}

// parseLease decodes a lease file: a JSON array of valid image IDs.
func parseLease(b []byte) ([]string, error) {
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return nil, fmt.Errorf("decode lease: %w", err)
	}
	for _, id := range ids {
		if !appc.ValidImageID(id) {
			return nil, fmt.Errorf("lease names invalid image ID %q", id)
		}
	}
	return ids, nil
}

// loadLeases reads the lease files into idx.Leases (after index.json was
// loaded: leases an older index held are written out as files first). Temp
// files of interrupted writes are removed. A lease file that cannot be
// read is dropped with a warning: it can only be the partial write of a
// machine crash, which ended its holder too, and the pod runtime leases a
// kept pod's app images again when it recovers it (internal/pod/leases.go).
// Keeping such a file as a lease of every image instead would block every
// image removal for good if its pod's record was lost in the same crash.
// IDs no longer in the store are left out.
func (s *FSStore) loadLeases(ctx context.Context) (migrated bool, err error) {
	if err := os.MkdirAll(s.leasesDir(), 0o700); err != nil {
		return false, fmt.Errorf("create leases folder: %w", err)
	}
	for holder, ids := range s.idx.Leases {
		if validHolder(holder) != nil {
			s.log.WarnContext(ctx, "dropping lease of an invalid holder from the index", "holder", holder)
			continue
		}
		if err := s.writeLease(holder, ids); err != nil {
			return false, err
		}
		migrated = true
	}
	s.idx.Leases = map[string][]string{}
	ents, err := os.ReadDir(s.leasesDir())
	if err != nil {
		return false, fmt.Errorf("read leases: %w", err)
	}
	for _, e := range ents {
		name, path := e.Name(), filepath.Join(s.leasesDir(), e.Name())
		if validHolder(name) != nil || !e.Type().IsRegular() {
			if err := os.RemoveAll(path); err != nil {
				return false, fmt.Errorf("remove %s: %w", path, err)
			}
			continue
		}
		b, err := os.ReadFile(path)
		var ids []string
		if err == nil {
			ids, err = parseLease(b)
		}
		if err != nil {
			s.log.WarnContext(ctx, "dropping unreadable lease", "holder", name, "err", err)
			if err := os.Remove(path); err != nil {
				return false, fmt.Errorf("remove %s: %w", path, err)
			}
			continue
		}
		ids = slices.DeleteFunc(ids, func(id string) bool { return s.idx.Entries[id] == nil })
		s.idx.Leases[name] = ids
	}
	return migrated, nil
}

// Remove deletes an app image and every entry no remaining app image or
// lease stands on. It refuses (Conflict) when a lease holds the image or
// another app image depends on it.
func (s *FSStore) Remove(ctx context.Context, idOrRef string) error {
	var trash []string
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.uniqueNameLocked(idOrRef); err != nil {
			return err
		}
		r, err := s.lookupLocked(idOrRef)
		if err != nil {
			return err
		}
		if !r.App {
			return errf(kerrors.Conflict, "%s is a layer; remove the images using it", r.ID)
		}
		for holder, ids := range s.idx.Leases {
			set := map[string]bool{}
			for _, id := range ids {
				s.closureLocked(id, set)
			}
			if set[r.ID] {
				return errf(kerrors.Conflict, "image %s is in use by %s", r.ID, holder)
			}
		}
		for id, o := range s.idx.Entries {
			if id == r.ID || !o.App {
				continue
			}
			set := map[string]bool{}
			s.closureLocked(id, set)
			if set[r.ID] {
				return errf(kerrors.Conflict, "image %s is a dependency of %s (%s)", r.ID, o.Name, id)
			}
		}
		r.App = false
		for ref, id := range s.idx.Refs {
			if id == r.ID {
				delete(s.idx.Refs, ref)
			}
		}
		r.Refs = nil
		t, err := s.gcLocked()
		trash = t
		if err != nil {
			return err
		}
		clear(s.resolved)
		return s.saveLocked()
	}()
	s.emptyTrash(ctx, trash)
	return err
}

func (s *FSStore) emptyTrash(ctx context.Context, trash []string) {
	for _, d := range trash {
		if rerr := os.RemoveAll(d); rerr != nil {
			s.log.WarnContext(ctx, "remove image files", "dir", d, "err", rerr)
		}
	}
}

// gcLocked drops every entry that no app image or lease stands on and no
// pull in progress has pinned; it moves their directories into tmp/ and
// returns them for deletion without the lock. Callers hold mu for writing
// and save the index afterwards.
func (s *FSStore) gcLocked() ([]string, error) {
	var trash []string
	keep := map[string]bool{}
	for id, o := range s.idx.Entries {
		if o.App {
			s.closureLocked(id, keep)
		}
	}
	for _, ids := range s.idx.Leases {
		for _, id := range ids {
			s.closureLocked(id, keep)
		}
	}
	for id, o := range s.idx.Entries {
		if keep[id] || (o.DiffID != "" && s.pins[o.DiffID] > 0) {
			continue
		}
		// Move out of entries/ now; the slow delete happens unlocked.
		dst, err := os.MkdirTemp(s.tmpDir(), "rm-")
		if err != nil {
			return trash, fmt.Errorf("remove image: %w", err)
		}
		if err := os.Rename(s.entryDir(id), filepath.Join(dst, "e")); err != nil {
			return trash, fmt.Errorf("remove image entry %s: %w", id, err)
		}
		trash = append(trash, dst)
		delete(s.idx.Entries, id)
		if o.DiffID != "" {
			delete(s.byDiff, o.DiffID)
		}
		for ref, rid := range s.idx.Refs {
			if rid == id {
				delete(s.idx.Refs, ref)
			}
		}
	}
	clear(s.resolved)
	return trash, nil
}

// pin keeps layers with these diffIDs from garbage collection while a pull
// that needs them runs; the returned func unpins them and collects what a
// failed pull left unreferenced.
func (s *FSStore) pin(ctx context.Context, diffIDs []string) func(failed bool) {
	s.mu.Lock()
	for _, d := range diffIDs {
		s.pins[d]++
	}
	s.mu.Unlock()
	return func(failed bool) {
		s.mu.Lock()
		for _, d := range diffIDs {
			if s.pins[d]--; s.pins[d] <= 0 {
				delete(s.pins, d)
			}
		}
		var trash []string
		if failed {
			var err error
			trash, err = s.gcLocked()
			if err == nil && len(trash) > 0 {
				err = s.saveLocked()
			}
			if err != nil {
				s.log.WarnContext(ctx, "collect layers of a failed pull", "err", err)
			}
		}
		s.mu.Unlock()
		s.emptyTrash(ctx, trash)
	}
}
