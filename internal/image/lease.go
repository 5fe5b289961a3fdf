package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"kurma.dev/kurma/internal/kerrors"
)

// Lease marks images (IDs, refs or names) as used by holder, so that Remove
// refuses them and everything they stand on. Leases are persisted.
func (s *FSStore) Lease(ctx context.Context, holder string, ids ...string) error {
	if holder == "" {
		return errf(kerrors.Invalid, "lease needs a holder")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := slices.Clone(s.idx.Leases[holder])
	for _, id := range ids {
		r, err := s.lookupLocked(id)
		if err != nil {
			return fmt.Errorf("lease %s: %w", holder, err)
		}
		if !slices.Contains(held, r.ID) {
			held = append(held, r.ID)
		}
	}
	s.idx.Leases[holder] = held
	return s.saveLocked()
}

// Unlease drops every lease of holder; an unknown holder is not an error.
func (s *FSStore) Unlease(ctx context.Context, holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idx.Leases[holder]; !ok {
		return nil
	}
	delete(s.idx.Leases, holder)
	return s.saveLocked()
}

// Remove deletes an app image and every entry no remaining app image or
// lease stands on. It refuses (Conflict) when a lease holds the image or
// another app image depends on it.
func (s *FSStore) Remove(ctx context.Context, idOrRef string) error {
	var trash []string
	err := func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
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
