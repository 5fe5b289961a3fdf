package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"kurma.dev/kurma/internal/image/tarx"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

func jsonMarshal(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return b, nil
}

const maxSniffEntries = 4096

// sniff tells an ACI from a docker-save tarball and an OCI archive by the
// names of its first entries.
func sniff(path string) (archiveKind, error) {
	if strings.HasSuffix(path, ".aci") {
		return kindACI, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for i := 0; i < maxSniffEntries; i++ {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		n := strings.TrimPrefix(cleanEntry(hdr.Name), "./")
		switch {
		case n == "manifest" || n == "rootfs" || strings.HasPrefix(n, "rootfs/"):
			return kindACI, nil
		case n == "manifest.json" || n == "repositories":
			return kindDocker, nil
		case n == "oci-layout" || n == "index.json":
			return kindOCI, nil
		}
	}
	return 0, errf(kerrors.Invalid, "%s is not an ACI, OCI archive or docker-save tarball", path)
}

func cleanEntry(n string) string { return path.Clean("/" + n)[1:] }

// pullACI extracts an ACI (plain, gzip, bzip2 or zstd tar with "manifest"
// and "rootfs/") into a new entry whose ID is the sha512 of the
// uncompressed tar.
func (s *FSStore) pullACI(ctx context.Context, u URI, file string, sig []byte, opts PullOptions, p func(Progress)) (_ *Image, retErr error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("open ACI: %w", err)
	}
	defer f.Close()
	var total int64
	if fi, err := f.Stat(); err == nil {
		total = fi.Size()
	}
	r, err := decompress(&progressReader{r: f, total: total, ref: u.Canonical, status: "extracting", p: p})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	tmp, rootfs, err := s.newRootfsTmp("aci-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	var man *appc.ImageManifest
	res, err := tarx.Extract(ctx, r, rootfs, tarx.Options{
		MaxBytes:     s.opts.MaxLayerBytes,
		Prefix:       "rootfs",
		AllowDevices: opts.RequireSignature || s.opts.AllowDevices,
		Other: func(hdr *tar.Header, r io.Reader) error {
			if cleanEntry(hdr.Name) != "manifest" {
				return nil
			}
			if man != nil {
				return errf(kerrors.Invalid, "ACI has two manifests")
			}
			data, err := io.ReadAll(io.LimitReader(r, maxManifestSize+1))
			if err != nil {
				return fmt.Errorf("read ACI manifest: %w", err)
			}
			m, err := ParseACIManifest(data)
			if err != nil {
				return err
			}
			if opts.RequireSignature && len(m.Dependencies) > 0 {
				return errf(kerrors.Unauthorized, "image %q has dependencies; a trusted (stager) image must have none", m.Name)
			}
			man = &m
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	if man == nil {
		return nil, errf(kerrors.Invalid, "ACI has no manifest")
	}
	id := res.Digest
	var verifiedBy string
	if opts.RequireSignature {
		if verifiedBy, err = s.checkTrust(id, man, sig); err != nil {
			return nil, err
		}
	}
	if err := s.bindDependencies(man); err != nil {
		return nil, err
	}
	rec := &record{App: true, VerifiedBy: verifiedBy, Image: Image{
		ID: id, Name: man.Name, Manifest: *man, HasRootfs: true,
		Size: res.Size, Created: time.Now().UTC(), Source: u.Canonical,
	}}
	return s.commit(tmp, rec, u.Canonical)
}

// bindDependencies fills each dependency's ImageID from the store: a given
// ID must be stored, a name must match one stored app image. Dependencies
// are never fetched.
func (s *FSStore) bindDependencies(m *appc.ImageManifest) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, d := range m.Dependencies {
		if d.ImageID != "" {
			if _, ok := s.idx.Entries[d.ImageID]; !ok {
				return errf(kerrors.NotFound, "dependency %q (%s) is not in the store; pull it first", d.ImageName, d.ImageID)
			}
			continue
		}
		r, err := s.lookupLocked(d.ImageName)
		if errors.Is(err, kerrors.NotFound) {
			return errf(kerrors.NotFound, "dependency %q is not in the store; pull it first (fetching dependencies by name is not supported)", d.ImageName)
		}
		if err != nil {
			return fmt.Errorf("dependency %q: %w", d.ImageName, err)
		}
		m.Dependencies[i].ImageID = r.ID
	}
	return nil
}
