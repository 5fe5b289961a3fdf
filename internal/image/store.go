package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

var _ Store = (*FSStore)(nil)

// Options configure a store.
type Options struct {
	// Keyring holds the keys trusted for PullOptions.RequireSignature.
	Keyring *trust.Keyring
	// HTTPClient fetches http(s):// images and registry blobs; nil means
	// http.DefaultClient.
	HTTPClient *http.Client
	// AllowDevices lets layers of any image carry device nodes. Without it,
	// only signature-verified (stager) images may.
	AllowDevices bool
	// MaxLayerBytes bounds every uncompressed tar stream a pull extracts
	// (an OCI layer, an ACI, an OCI archive); a larger one fails the pull
	// with Invalid and leaves nothing in the store. Zero means
	// tarx.DefaultMaxBytes (64 GiB), negative no bound.
	MaxLayerBytes int64
	// Logger, nil means slog.Default().
	Logger *slog.Logger
}

// record is one entry of the index.
type record struct {
	Image
	// App is set for images pulled by a user (listed, removable); bare
	// layers have it false.
	App bool `json:"app"`
	// DiffID is the OCI uncompressed-layer digest of a layer entry.
	DiffID string `json:"diffID,omitempty"`
	// VerifiedBy is the hex ID of the trusted key whose signature was
	// checked when the image was pulled with RequireSignature; later
	// trusted pulls of the stored image skip refetching the signature
	// while that key is still trusted.
	VerifiedBy string `json:"verifiedBy,omitempty"`
}

type indexFile struct {
	Version int                `json:"version"`
	Entries map[string]*record `json:"entries"`
	Refs    map[string]string  `json:"refs"`
	// Leases are kept in memory only: their files are under leases/
	// (lease.go). Indexes of older versions stored them here.
	Leases map[string][]string `json:"leases,omitempty"`
}

// FSStore is the Store on a local directory:
//
//	<root>/entries/<id>/rootfs     extracted root filesystem (layers, ACIs)
//	<root>/entries/<id>/manifest   appc image manifest (JSON)
//	<root>/index.json              refs and entries (written atomically, fsynced)
//	<root>/leases/<holder>         the images a holder leases (lease.go)
//	<root>/tmp/                    work in progress, emptied by Open
//	<root>/lock                    flock(2)ed by the one process using the store
//
// Layer reference counts are not stored: they are derived from the
// dependency graph of the app images, so they cannot drift.
type FSStore struct {
	root string
	opts Options
	log  *slog.Logger

	// mu guards idx, byDiff and resolved, and serialises writes of
	// index.json and renames into entries/.
	mu       sync.RWMutex
	idx      indexFile
	byDiff   map[string]string  // OCI diffID -> layer entry ID
	resolved map[string][]Layer // Resolve cache, dropped on Remove
	pins     map[string]int     // diffID -> pulls in progress needing it

	// flights deduplicates concurrent pulls of one URI and concurrent
	// extractions of one layer.
	flights singleflight.Group

	// lock holds the store's exclusive flock until Close.
	lock *os.File
}

// Open opens (creating if needed) the store rooted at dir. Leftovers of an
// interrupted pull (tmp/, entries missing from the index) are removed.
// One process at a time may have a store open (an exclusive flock on
// <dir>/lock, released by Close or the process's end): another gets
// kerrors.Conflict, before anything is touched.
func Open(ctx context.Context, dir string, opts Options) (_ *FSStore, retErr error) {
	s := &FSStore{root: dir, opts: opts, log: opts.Logger, resolved: map[string][]Layer{}, byDiff: map[string]string{}, pins: map[string]int{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create image store: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open image store lock: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, kerrors.New(kerrors.Conflict, "image store %s is in use by another process (or another Open in this one)", dir)
		}
		return nil, fmt.Errorf("lock image store: %w", err)
	}
	s.lock = lock
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("clean image store tmp: %w", err)
	}
	for _, d := range []string{s.entriesDir(), s.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create image store: %w", err)
		}
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	migrated, err := s.loadLeases(ctx)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(s.entriesDir())
	if err != nil {
		return nil, fmt.Errorf("read image store: %w", err)
	}
	for _, e := range ents {
		if _, ok := s.idx.Entries[e.Name()]; !ok {
			s.log.InfoContext(ctx, "removing orphan image entry", "id", e.Name())
			if err := os.RemoveAll(filepath.Join(s.entriesDir(), e.Name())); err != nil {
				return nil, fmt.Errorf("remove orphan entry: %w", err)
			}
		}
	}
	for id, r := range s.idx.Entries {
		if _, err := os.Stat(s.entryDir(id)); err != nil {
			s.log.WarnContext(ctx, "image entry missing on disk, dropping it", "id", id)
			delete(s.idx.Entries, id)
			continue
		}
		if r.DiffID != "" {
			s.byDiff[r.DiffID] = id
		}
	}
	for ref, id := range s.idx.Refs {
		if _, ok := s.idx.Entries[id]; !ok {
			delete(s.idx.Refs, ref)
		}
	}
	// Layers of a pull that never finished are unreferenced: collect them.
	s.mu.Lock()
	trash, err := s.gcLocked()
	if err == nil && (len(trash) > 0 || migrated) {
		err = s.saveLocked()
	}
	s.mu.Unlock()
	s.emptyTrash(ctx, trash)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases the store's lock. The store must not be used after.
func (s *FSStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close() // closing the only descriptor drops the flock
	s.lock = nil
	return err
}

func (s *FSStore) entriesDir() string        { return filepath.Join(s.root, "entries") }
func (s *FSStore) tmpDir() string            { return filepath.Join(s.root, "tmp") }
func (s *FSStore) entryDir(id string) string { return filepath.Join(s.root, "entries", id) }
func (s *FSStore) indexPath() string         { return filepath.Join(s.root, "index.json") }

// RootfsPath is the host path of an entry's extracted root filesystem.
func (s *FSStore) RootfsPath(id string) string { return filepath.Join(s.entryDir(id), "rootfs") }

func (s *FSStore) load() error {
	s.idx = indexFile{Version: 1, Entries: map[string]*record{}, Refs: map[string]string{}, Leases: map[string][]string{}}
	b, err := os.ReadFile(s.indexPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read image index: %w", err)
	}
	if err := json.Unmarshal(b, &s.idx); err != nil {
		return fmt.Errorf("parse image index %s: %w", s.indexPath(), err)
	}
	if s.idx.Entries == nil {
		s.idx.Entries = map[string]*record{}
	}
	if s.idx.Refs == nil {
		s.idx.Refs = map[string]string{}
	}
	if s.idx.Leases == nil {
		s.idx.Leases = map[string][]string{}
	}
	for id := range s.idx.Entries {
		if !appc.ValidImageID(id) {
			return fmt.Errorf("image index: invalid entry ID %q", id)
		}
	}
	return nil
}

// saveLocked writes index.json atomically. Callers hold mu for writing.
func (s *FSStore) saveLocked() error {
	idx := s.idx
	idx.Leases = nil // in their own files
	b, err := json.Marshal(&idx)
	if err != nil {
		return fmt.Errorf("encode image index: %w", err)
	}
	tmp := s.indexPath() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write image index: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write image index: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync image index: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write image index: %w", err)
	}
	if err := os.Rename(tmp, s.indexPath()); err != nil {
		return fmt.Errorf("commit image index: %w", err)
	}
	return nil
}

// public returns a copy of a record's image with its refs.
func (s *FSStore) public(r *record) *Image {
	img := r.Image
	img.Refs = slices.Clone(r.Refs)
	return &img
}

// lookupLocked finds an entry by ID, reference, unique ID prefix (with or
// without "sha512-", at least 4 characters) or app image name (the newest
// of that name). Callers hold mu.
func (s *FSStore) lookupLocked(idOrRef string) (*record, error) {
	if r, ok := s.idx.Entries[idOrRef]; ok {
		return r, nil
	}
	if id, ok := s.idx.Refs[idOrRef]; ok {
		if r, ok := s.idx.Entries[id]; ok {
			return r, nil
		}
	}
	if u, err := ParseURI(idOrRef, false); err == nil {
		if id, ok := s.idx.Refs[u.Canonical]; ok {
			if r, ok := s.idx.Entries[id]; ok {
				return r, nil
			}
		}
	}
	var match []*record
	prefix := idOrRef
	if !strings.HasPrefix(prefix, "sha512-") {
		prefix = "sha512-" + prefix
	}
	if len(idOrRef) >= 4 && !strings.ContainsAny(idOrRef, "/:") {
		for id, r := range s.idx.Entries {
			if strings.HasPrefix(id, prefix) {
				match = append(match, r)
			}
		}
	}
	if len(match) == 0 {
		// By image name: the newest app image of that name.
		var newest *record
		for _, r := range s.idx.Entries {
			if r.App && r.Name == idOrRef && (newest == nil || r.Created.After(newest.Created)) {
				newest = r
			}
		}
		if newest != nil {
			return newest, nil
		}
	}
	switch len(match) {
	case 0:
		return nil, errf(kerrors.NotFound, "image %q not found", idOrRef)
	case 1:
		return match[0], nil
	}
	return nil, errf(kerrors.Conflict, "image %q is ambiguous (%d matches)", idOrRef, len(match))
}

// uniqueNameLocked refuses a name that several app images carry (an ACI
// and an OCI image both named kurma.dev/busybox, say), listing them, for
// the verbs where picking the newest would be a surprise (Remove). An ID,
// reference or name of one image passes. Callers hold mu.
func (s *FSStore) uniqueNameLocked(idOrRef string) error {
	if _, ok := s.idx.Entries[idOrRef]; ok {
		return nil
	}
	if _, ok := s.idx.Refs[idOrRef]; ok {
		return nil
	}
	var cands []string
	for _, r := range s.idx.Entries {
		if r.App && r.Name == idOrRef {
			c := r.ID
			if len(r.Refs) > 0 {
				c += " (" + strings.Join(r.Refs, ", ") + ")"
			}
			cands = append(cands, c)
		}
	}
	if len(cands) < 2 {
		return nil
	}
	slices.Sort(cands)
	return errf(kerrors.Conflict, "image name %q is ambiguous: name one of its %d images by ID or reference: %s",
		idOrRef, len(cands), strings.Join(cands, "; "))
}

// Get returns an entry by ID, reference, unique ID prefix or name.
func (s *FSStore) Get(ctx context.Context, idOrRef string) (*Image, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, err := s.lookupLocked(idOrRef)
	if err != nil {
		return nil, err
	}
	return s.public(r), nil
}

// List returns the app images, oldest first.
func (s *FSStore) List(ctx context.Context) ([]*Image, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*Image
	for _, r := range s.idx.Entries {
		if r.App {
			out = append(out, s.public(r))
		}
	}
	slices.SortFunc(out, func(a, b *Image) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Resolve returns an image's layers top-most first (the image itself first
// when it has a root filesystem, then its dependencies, depth first). A
// layer appearing twice is kept at its top-most position only. Results are
// cached in memory.
func (s *FSStore) Resolve(ctx context.Context, id string) ([]Layer, error) {
	s.mu.RLock()
	r, err := s.lookupLocked(id)
	if err != nil {
		s.mu.RUnlock()
		return nil, err
	}
	if ls, ok := s.resolved[r.ID]; ok {
		s.mu.RUnlock()
		return slices.Clone(ls), nil
	}
	var out []Layer
	seen := map[string]bool{}
	err = s.walkLocked(r, 0, func(e *record) {
		if e.HasRootfs && !seen[e.ID] {
			seen[e.ID] = true
			out = append(out, Layer{ID: e.ID, Manifest: e.Manifest, Path: s.RootfsPath(e.ID)})
		}
	})
	s.mu.RUnlock()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.resolved[r.ID] = out
	s.mu.Unlock()
	return slices.Clone(out), nil
}

const maxDepth = 64

// walkLocked visits r and its dependencies, top-most first.
func (s *FSStore) walkLocked(r *record, depth int, visit func(*record)) error {
	if depth > maxDepth {
		return errf(kerrors.Invalid, "image %s: dependency chain deeper than %d (cycle?)", r.ID, maxDepth)
	}
	visit(r)
	for _, d := range r.Manifest.Dependencies {
		dep, ok := s.idx.Entries[d.ImageID]
		if !ok {
			return errf(kerrors.NotFound, "image %s: dependency %q (%s) is not in the store", r.ID, d.ImageName, d.ImageID)
		}
		if err := s.walkLocked(dep, depth+1, visit); err != nil {
			return err
		}
	}
	return nil
}

// closureLocked is the set of entry IDs r stands on, r included.
func (s *FSStore) closureLocked(id string, set map[string]bool) {
	r, ok := s.idx.Entries[id]
	if !ok || set[id] {
		return
	}
	set[id] = true
	for _, d := range r.Manifest.Dependencies {
		s.closureLocked(d.ImageID, set)
	}
}
