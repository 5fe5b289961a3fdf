package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kurma.dev/kurma/internal/image/tarx"
	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

const refNameAnnotation = "org.opencontainers.image.ref.name"

func (s *FSStore) platform() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

func (s *FSStore) pullRegistry(ctx context.Context, u URI, opts PullOptions, p func(Progress)) (*Image, error) {
	// Credentials come from the usual docker config (anonymous when none).
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(s.platform()),
		remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if s.opts.HTTPClient != nil && s.opts.HTTPClient.Transport != nil {
		ropts = append(ropts, remote.WithTransport(s.opts.HTTPClient.Transport))
	}
	img, err := remote.Image(u.Ref, ropts...)
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) && (terr.StatusCode == 404 || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode)) {
			return nil, fmt.Errorf("%w: %w", kerrors.NotFound, err)
		}
		return nil, fmt.Errorf("%w: %w", kerrors.Unavailable, err)
	}
	tag := ""
	if t, ok := u.Ref.(name.Tag); ok {
		tag = t.TagStr()
	}
	return s.pullOCI(ctx, img, u, u.Ref.Context().Name(), tag, nil, opts, p)
}

func hasCode(e *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range e.Errors {
		if slices.Contains(codes, d.Code) {
			return true
		}
	}
	return false
}

// pullLayout pulls the image of an OCI layout directory: the only image, or
// the one for this platform.
func (s *FSStore) pullLayout(ctx context.Context, u URI, dir string, sig []byte, opts PullOptions, p func(Progress)) (*Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errf(kerrors.Invalid, "%s is not an OCI layout: %v", dir, err)
	}
	img, tag, err := s.pickImage(idx, 0)
	if err != nil {
		return nil, err
	}
	nm := imageName(u, tag)
	if t, err := name.NewTag(tag); err == nil && strings.ContainsAny(tag, ":/") {
		tag = t.TagStr()
	}
	return s.pullOCI(ctx, img, u, nm, tag, sig, opts, p)
}

func imageName(u URI, tag string) string {
	base := filepath.Base(u.Path)
	if u.Scheme != SchemeFile {
		base = filepath.Base(u.Canonical)
	}
	if strings.ContainsAny(tag, ":/") {
		if n, err := name.NewTag(tag); err == nil {
			return n.Context().Name()
		}
	}
	return base
}

func (s *FSStore) pickImage(idx v1.ImageIndex, depth int) (v1.Image, string, error) {
	if depth > 4 {
		return nil, "", errf(kerrors.Invalid, "OCI index nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", errf(kerrors.Invalid, "read OCI index: %v", err)
	}
	plat := s.platform()
	var pick *v1.Descriptor
	for i := range im.Manifests {
		d := &im.Manifests[i]
		if d.Platform == nil || d.Platform.Satisfies(plat) || len(im.Manifests) == 1 {
			pick = d
			break
		}
	}
	if pick == nil {
		return nil, "", errf(kerrors.NotFound, "OCI index has no image for %s/%s", plat.OS, plat.Architecture)
	}
	tag := pick.Annotations[refNameAnnotation]
	if pick.MediaType.IsIndex() {
		child, err := idx.ImageIndex(pick.Digest)
		if err != nil {
			return nil, "", errf(kerrors.Invalid, "read OCI index %s: %v", pick.Digest, err)
		}
		img, t, err := s.pickImage(child, depth+1)
		if tag == "" {
			tag = t
		}
		return img, tag, err
	}
	img, err := idx.Image(pick.Digest)
	if err != nil {
		return nil, "", errf(kerrors.Invalid, "read OCI image %s: %v", pick.Digest, err)
	}
	return img, tag, nil
}

// pullOCIArchive unpacks an OCI layout tarball (safely) and pulls it.
func (s *FSStore) pullOCIArchive(ctx context.Context, u URI, file string, sig []byte, opts PullOptions, p func(Progress)) (*Image, error) {
	tmp, err := s.newTmp("ocitar-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("open OCI archive: %w", err)
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if _, err := tarx.Extract(ctx, r, tmp, tarx.Options{MaxBytes: s.opts.MaxLayerBytes}); err != nil {
		return nil, fmt.Errorf("unpack OCI archive: %w", err)
	}
	return s.pullLayout(ctx, u, tmp, sig, opts, p)
}

func (s *FSStore) pullDockerArchive(ctx context.Context, u URI, file string, sig []byte, opts PullOptions, p func(Progress)) (*Image, error) {
	plain, cleanup, err := s.decompressedFile(file)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	file = plain
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		return nil, errf(kerrors.Invalid, "read docker archive: %v", err)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
	tag := ""
	if err == nil && len(m) > 0 && len(m[0].RepoTags) > 0 {
		tag = m[0].RepoTags[0]
	}
	nm := imageName(u, tag)
	if t, err := name.NewTag(tag); err == nil {
		tag = t.TagStr()
	}
	return s.pullOCI(ctx, img, u, nm, tag, sig, opts, p)
}

// pullOCI stores an OCI image: one layer entry per layer (deduplicated by
// diffID) and an app-image entry without rootfs whose ID is the sha512 of
// the raw config blob (the config names every layer's diffID, so it pins
// the whole filesystem) and whose dependencies are the layers, top-most
// first.
func (s *FSStore) pullOCI(ctx context.Context, img v1.Image, u URI, imgName, tag string, sig []byte, opts PullOptions, p func(Progress)) (_ *Image, retErr error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%w: read OCI config: %w", kerrors.Unavailable, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, errf(kerrors.Invalid, "parse OCI config: %v", err)
	}
	sum := sha512.Sum512(raw)
	appID := "sha512-" + hex.EncodeToString(sum[:])
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%w: list layers: %w", kerrors.Unavailable, err)
	}
	man, err := ConvertOCIConfig(cf, imgName, tag, u.Canonical)
	if err != nil {
		return nil, err
	}
	if opts.RequireSignature {
		if err := s.opts.Keyring.Verify(appID, sig); err != nil {
			return nil, err
		}
		if len(layers) > 0 {
			return nil, errf(kerrors.Unauthorized, "OCI image %s has %d layers; a trusted (stager) image must be an ACI without dependencies", u.Raw, len(layers))
		}
	}
	var diffIDs []string
	for _, d := range cf.RootFS.DiffIDs {
		diffIDs = append(diffIDs, d.String())
	}
	unpin := s.pin(ctx, diffIDs)
	defer func() { unpin(retErr != nil) }()
	s.mu.RLock()
	_, have := s.idx.Entries[appID]
	s.mu.RUnlock()
	var size int64
	if !have {
		ids := make([]string, len(layers))
		for i, l := range layers {
			id, n, err := s.pullLayer(ctx, l, u, opts, p)
			if err != nil {
				return nil, fmt.Errorf("layer %d: %w", i, err)
			}
			ids[i] = id
			size += n
		}
		for i := len(ids) - 1; i >= 0; i-- {
			man.Dependencies = append(man.Dependencies, appc.Dependency{ImageName: layerName(ids[i]), ImageID: ids[i]})
		}
	}
	tmp, err := s.newTmp("app-")
	if err != nil {
		return nil, err
	}
	rec := &record{App: true, Image: Image{
		ID: appID, Name: man.Name, Manifest: man, Size: size,
		Created: time.Now().UTC(), Source: u.Canonical,
	}}
	return s.commit(tmp, rec, u.Canonical)
}

func layerName(id string) string { return "kurma.dev/layer/" + id[len("sha512-"):len("sha512-")+16] }

// pullLayer returns the entry ID of an OCI layer, extracting it once.
func (s *FSStore) pullLayer(ctx context.Context, l v1.Layer, u URI, opts PullOptions, p func(Progress)) (string, int64, error) {
	diff, err := l.DiffID()
	if err != nil {
		return "", 0, fmt.Errorf("%w: layer diffID: %w", kerrors.Unavailable, err)
	}
	lookup := func() (string, int64, bool) {
		s.mu.RLock()
		defer s.mu.RUnlock()
		if id, ok := s.byDiff[diff.String()]; ok {
			return id, s.idx.Entries[id].Size, true
		}
		return "", 0, false
	}
	if id, n, ok := lookup(); ok {
		p(Progress{Ref: diff.String(), Status: "cached"})
		return id, n, nil
	}
	v, err, _ := s.flights.Do("layer:"+diff.String(), func() (any, error) {
		if id, n, ok := lookup(); ok {
			return [2]any{id, n}, nil
		}
		img, err := s.extractLayer(ctx, l, diff, u, p)
		if err != nil {
			return nil, err
		}
		return [2]any{img.ID, img.Size}, nil
	})
	if err != nil {
		return "", 0, err
	}
	r := v.([2]any)
	return r[0].(string), r[1].(int64), nil
}

func (s *FSStore) extractLayer(ctx context.Context, l v1.Layer, diff v1.Hash, u URI, p func(Progress)) (_ *Image, retErr error) {
	total, _ := l.Size()
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("%w: fetch layer %s: %w", kerrors.Unavailable, diff, err)
	}
	defer rc.Close()
	r, err := decompress(&progressReader{r: rc, total: total, ref: diff.String(), status: "fetching", p: p})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	tmp, rootfs, err := s.newRootfsTmp("layer-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	h := sha256.New()
	res, err := tarx.Extract(ctx, io.TeeReader(r, h), rootfs, tarx.Options{Whiteouts: true, AllowDevices: s.opts.AllowDevices, MaxBytes: s.opts.MaxLayerBytes})
	if err != nil {
		return nil, fmt.Errorf("extract layer %s: %w", diff, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diff.String() {
		return nil, errf(kerrors.Invalid, "layer %s: content digest is %s", diff, got)
	}
	if err := rc.Close(); err != nil {
		// Registry layers verify their compressed digest on Close.
		return nil, errf(kerrors.Invalid, "layer %s: %v", diff, err)
	}
	p(Progress{Ref: diff.String(), Status: "extracting", Current: res.Size, Total: res.Size})
	rec := &record{DiffID: diff.String(), Image: Image{
		ID: res.Digest, Name: layerName(res.Digest), HasRootfs: true, Size: res.Size,
		Created: time.Now().UTC(), Source: u.Canonical,
		Manifest: appc.ImageManifest{
			ACKind: appc.KindImageManifest, ACVersion: appc.ACVersion, Name: layerName(res.Digest),
			Annotations: []appc.Annotation{{Name: AnnotationDiffID, Value: diff.String()}},
		},
	}}
	return s.commit(tmp, rec)
}

// decompressedFile returns file itself when it is not compressed, else a
// decompressed copy in tmp/ (go-containerregistry reads docker-save
// tarballs by seeking).
func (s *FSStore) decompressedFile(file string) (string, func(), error) {
	f, err := os.Open(file)
	if err != nil {
		return "", nil, fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	magic := make([]byte, 4)
	n, _ := io.ReadFull(f, magic)
	if n < 2 || !(magic[0] == 0x1f && magic[1] == 0x8b) && string(magic[:min(n, 3)]) != "BZh" &&
		!(n == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
		return file, func() {}, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", nil, fmt.Errorf("read archive: %w", err)
	}
	r, err := decompress(f)
	if err != nil {
		return "", nil, err
	}
	defer r.Close()
	out, err := os.CreateTemp(s.tmpDir(), "plain-")
	if err != nil {
		return "", nil, fmt.Errorf("decompress archive: %w", err)
	}
	cleanup := func() { os.Remove(out.Name()) }
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("%w: decompress archive: %w", kerrors.Invalid, err)
	}
	return out.Name(), cleanup, nil
}
