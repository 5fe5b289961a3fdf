package pod

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"sync"

	"kurma.dev/kurma/internal/image"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// memStore is an image.Store over folders the test prepared: it stands in
// for the image store (tested in its own package) so that these tests
// exercise the pod manager's side of the contract. "Signed" images model
// what the real store verifies.
type memStore struct {
	mu     sync.Mutex
	imgs   map[string]*memImage
	refs   map[string]string
	leases map[string][]string
}

type memImage struct {
	img    image.Image
	path   string
	signed bool
}

func newMemStore() *memStore {
	return &memStore{imgs: map[string]*memImage{}, refs: map[string]string{}, leases: map[string][]string{}}
}

var _ image.Store = (*memStore)(nil)

// add stores an image whose rootfs is dir, reachable by ref.
func (s *memStore) add(ref, dir string, m appc.ImageManifest, signed bool) string {
	sum := sha512.Sum512([]byte(ref))
	id := "sha512-" + hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	s.imgs[id] = &memImage{img: image.Image{ID: id, Name: m.Name, Manifest: m, HasRootfs: dir != "", Source: ref}, path: dir, signed: signed}
	s.refs[ref] = id
	return id
}

func (s *memStore) find(ref string) (*memImage, error) {
	if id, ok := s.refs[ref]; ok {
		ref = id
	}
	if m, ok := s.imgs[ref]; ok {
		return m, nil
	}
	return nil, kerrors.New(kerrors.NotFound, "image %q not found", ref)
}

func (s *memStore) Pull(ctx context.Context, uri string, opts image.PullOptions) (*image.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.find(uri)
	if err != nil {
		return nil, kerrors.New(kerrors.Unavailable, "cannot fetch %s", uri)
	}
	if opts.RequireSignature && !m.signed {
		return nil, kerrors.New(kerrors.Unauthorized, "image %s is not signed by a trusted key", uri)
	}
	img := m.img
	return &img, nil
}

func (s *memStore) Get(ctx context.Context, ref string) (*image.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.find(ref)
	if err != nil {
		return nil, err
	}
	img := m.img
	return &img, nil
}

func (s *memStore) List(ctx context.Context) ([]*image.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*image.Image
	for _, m := range s.imgs {
		img := m.img
		out = append(out, &img)
	}
	return out, nil
}

func (s *memStore) Remove(ctx context.Context, ref string) error {
	return fmt.Errorf("not supported")
}

func (s *memStore) Resolve(ctx context.Context, id string) ([]image.Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.find(id)
	if err != nil {
		return nil, err
	}
	var out []image.Layer
	if m.img.HasRootfs {
		out = append(out, image.Layer{ID: m.img.ID, Manifest: m.img.Manifest, Path: m.path})
	}
	for _, d := range m.img.Manifest.Dependencies {
		dm, err := s.find(d.ImageID)
		if err != nil {
			return nil, err
		}
		out = append(out, image.Layer{ID: dm.img.ID, Manifest: dm.img.Manifest, Path: dm.path})
	}
	return out, nil
}

func (s *memStore) Lease(ctx context.Context, holder string, ids ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leases[holder] = append(s.leases[holder], ids...)
	return nil
}

func (s *memStore) Unlease(ctx context.Context, holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leases, holder)
	return nil
}

func (s *memStore) leaseCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}
