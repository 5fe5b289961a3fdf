package image

import (
	"bufio"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// Pull fetches uri unless an image with that reference is already stored,
// and returns the app image. Concurrent pulls of one URI share one fetch;
// concurrent pulls sharing a layer extract it once.
//
// With RequireSignature (stager images) the image must carry a detached
// signature (URI + ".sig") by a key of Options.Keyring over its ID, and must
// have no dependencies; otherwise the pull fails with kerrors.Unauthorized
// and stores nothing. A stored image whose verifying key is no longer
// trusted is checked against the signature found now, and fetched again
// when that signature is not over it (the image was rebuilt).
//
// A fetch shared by concurrent callers runs under the first caller's
// context and reports progress to the first caller only.
func (s *FSStore) Pull(ctx context.Context, uri string, opts PullOptions) (*Image, error) {
	u, err := ParseURI(uri, opts.Insecure)
	if err != nil {
		return nil, err
	}
	if opts.RequireSignature {
		if _, err := u.sigURI(); err != nil {
			return nil, err
		}
	}
	s.mu.RLock()
	var cached *Image
	var verifiedBy string
	if id, ok := s.idx.Refs[u.Canonical]; ok {
		if r, ok := s.idx.Entries[id]; ok {
			cached, verifiedBy = s.public(r), r.VerifiedBy
		}
	}
	s.mu.RUnlock()
	if cached != nil && opts.RequireSignature && (verifiedBy == "" || !s.opts.Keyring.HasKeyID(verifiedBy)) {
		sig, err := s.fetchSig(ctx, u)
		if err != nil {
			return nil, err
		}
		if kid, err := s.checkTrust(cached.ID, &cached.Manifest, sig); err == nil {
			s.setVerified(cached.ID, kid)
		} else {
			// The signature there now is not over the stored image: the
			// image behind the reference may have been rebuilt (and
			// signed by a new key) since it was stored. Fetch it again;
			// that pull checks the signature against what it fetches.
			cached = nil
		}
	}
	if cached != nil {
		if opts.Progress != nil {
			opts.Progress(Progress{Status: "cached"})
		}
		return cached, nil
	}
	key := "pull:" + strconv.FormatBool(opts.RequireSignature) + ":" + u.Canonical
	v, err, _ := s.flights.Do(key, func() (any, error) { return s.pull(ctx, u, opts) })
	if err != nil {
		return nil, err
	}
	img := *v.(*Image)
	img.Refs = slices.Clone(img.Refs)
	return &img, nil
}

func (s *FSStore) pull(ctx context.Context, u URI, opts PullOptions) (*Image, error) {
	p := opts.Progress
	if p == nil {
		p = func(Progress) {}
	}
	p(Progress{Status: "resolving"})
	var sig []byte
	if opts.RequireSignature {
		var err error
		if sig, err = s.fetchSig(ctx, u); err != nil {
			return nil, fmt.Errorf("pull %s: %w", u.Raw, err)
		}
	}
	var img *Image
	var err error
	switch u.Scheme {
	case SchemeDocker:
		img, err = s.pullRegistry(ctx, u, opts, p)
	case SchemeFile:
		img, err = s.pullPath(ctx, u, u.Path, sig, opts, p)
	default:
		img, err = s.pullHTTP(ctx, u, sig, opts, p)
	}
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", u.Raw, err)
	}
	p(Progress{Status: "done"})
	return img, nil
}

func (s *FSStore) httpClient() *http.Client {
	if s.opts.HTTPClient != nil {
		return s.opts.HTTPClient
	}
	return http.DefaultClient
}

// checkTrust applies the stager trust rule to an image ID and manifest.
// It returns the hex ID of the key that signed.
func (s *FSStore) checkTrust(id string, m *appc.ImageManifest, sig []byte) (string, error) {
	if n := len(m.Dependencies); n > 0 {
		return "", errf(kerrors.Unauthorized, "image %s has %d dependencies; a trusted (stager) image must have none", id, n)
	}
	return s.opts.Keyring.VerifyKey(id, sig)
}

// setVerified records which key verified an image (best effort: losing it
// only means the signature is fetched again).
func (s *FSStore) setVerified(id, keyID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.idx.Entries[id]; ok && r.VerifiedBy != keyID {
		r.VerifiedBy = keyID
		if err := s.saveLocked(); err != nil {
			s.log.Warn("save image index", "err", err)
		}
	}
}

const maxSigSize = 4096

func (s *FSStore) fetchSig(ctx context.Context, u URI) ([]byte, error) {
	loc, err := u.sigURI()
	if err != nil {
		return nil, err
	}
	if u.Scheme == SchemeFile {
		b, err := os.ReadFile(loc)
		if err != nil {
			return nil, errf(kerrors.Unauthorized, "no signature at %s: %v", loc, err)
		}
		if len(b) > maxSigSize {
			return nil, errf(kerrors.Unauthorized, "signature %s larger than %d bytes", loc, maxSigSize)
		}
		return b, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc, nil)
	if err != nil {
		return nil, errf(kerrors.Invalid, "signature URL %s: %v", loc, err)
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch signature %s: %w: %w", loc, kerrors.Unavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errf(kerrors.Unauthorized, "no signature at %s (HTTP %d)", loc, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSigSize+1))
	if err != nil {
		return nil, fmt.Errorf("fetch signature %s: %w: %w", loc, kerrors.Unavailable, err)
	}
	if len(b) > maxSigSize {
		return nil, errf(kerrors.Unauthorized, "signature %s larger than %d bytes", loc, maxSigSize)
	}
	return b, nil
}

// pullHTTP downloads the image into tmp/ and pulls it as a file.
func (s *FSStore) pullHTTP(ctx context.Context, u URI, sig []byte, opts PullOptions, p func(Progress)) (*Image, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.Canonical, nil)
	if err != nil {
		return nil, errf(kerrors.Invalid, "image URL: %v", err)
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", kerrors.Unavailable, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errf(kerrors.NotFound, "HTTP 404")
	case resp.StatusCode != http.StatusOK:
		return nil, errf(kerrors.Unavailable, "HTTP %d", resp.StatusCode)
	}
	f, err := os.CreateTemp(s.tmpDir(), "dl-")
	if err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cr := &progressReader{r: resp.Body, total: resp.ContentLength, ref: u.Canonical, status: "fetching", p: p}
	if _, err := io.Copy(f, cr); err != nil {
		return nil, fmt.Errorf("download: %w: %w", kerrors.Unavailable, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	return s.pullPath(ctx, u, f.Name(), sig, opts, p)
}

// pullPath pulls a local OCI layout directory, OCI archive, docker-save
// tarball or ACI.
func (s *FSStore) pullPath(ctx context.Context, u URI, path string, sig []byte, opts PullOptions, p func(Progress)) (*Image, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errf(kerrors.NotFound, "%s does not exist", path)
	}
	if err != nil {
		return nil, fmt.Errorf("stat image: %w", err)
	}
	if fi.IsDir() {
		return s.pullLayout(ctx, u, path, sig, opts, p)
	}
	kind, err := sniff(path)
	if err != nil {
		return nil, err
	}
	switch kind {
	case kindACI:
		return s.pullACI(ctx, u, path, sig, opts, p)
	case kindDocker:
		return s.pullDockerArchive(ctx, u, path, sig, opts, p)
	default:
		return s.pullOCIArchive(ctx, u, path, sig, opts, p)
	}
}

type archiveKind int

const (
	kindACI archiveKind = iota
	kindDocker
	kindOCI
)

// decompress detects gzip, bzip2 and zstd by their magic numbers; anything
// else is read as is.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, errf(kerrors.Invalid, "gzip: %v", err)
		}
		return zr, nil
	case len(magic) >= 3 && string(magic[:3]) == "BZh":
		return io.NopCloser(bzip2.NewReader(br)), nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, errf(kerrors.Invalid, "zstd: %v", err)
		}
		return zr.IOReadCloser(), nil
	case len(magic) >= 4 && magic[0] == 0xfd && string(magic[1:4]) == "7zX":
		return nil, errf(kerrors.Invalid, "xz-compressed images are not supported; use gzip")
	}
	return io.NopCloser(br), nil
}

type progressReader struct {
	r      io.Reader
	n      int64
	total  int64
	ref    string
	status string
	p      func(Progress)
	last   time.Time
}

func (c *progressReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if now := time.Now(); err != nil || now.Sub(c.last) > 100*time.Millisecond {
		c.last = now
		total := c.total
		if total < 0 {
			total = 0
		}
		c.p(Progress{Ref: c.ref, Status: c.status, Current: c.n, Total: total})
	}
	return n, err
}

// newTmp makes a work directory under tmp/; Open removes leftovers.
func (s *FSStore) newTmp(prefix string) (string, error) {
	d, err := os.MkdirTemp(s.tmpDir(), prefix)
	if err != nil {
		return "", fmt.Errorf("image store work dir: %w", err)
	}
	return d, nil
}

// newRootfsTmp makes a work directory with an empty rootfs/ in it, for
// one extraction. The caller removes tmp once anything after fails.
func (s *FSStore) newRootfsTmp(prefix string) (tmp, rootfs string, err error) {
	tmp, err = s.newTmp(prefix)
	if err != nil {
		return "", "", err
	}
	rootfs = filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", "", fmt.Errorf("create rootfs: %w", err)
	}
	return tmp, rootfs, nil
}

// commit moves tmp (holding rootfs/ for entries with one) into
// entries/<rec.ID>, unless that entry exists already, records rec and
// points refs at it. tmp is gone afterwards either way.
func (s *FSStore) commit(tmp string, rec *record, refs ...string) (*Image, error) {
	defer os.RemoveAll(tmp)
	if err := writeManifest(filepath.Join(tmp, "manifest"), rec); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.idx.Entries[rec.ID]
	if ok {
		cur.App = cur.App || rec.App
		if rec.VerifiedBy != "" {
			cur.VerifiedBy = rec.VerifiedBy
		}
		if cur.Source == "" {
			cur.Source = rec.Source
		}
	} else {
		if err := os.Rename(tmp, s.entryDir(rec.ID)); err != nil {
			return nil, fmt.Errorf("commit image %s: %w", rec.ID, err)
		}
		s.idx.Entries[rec.ID] = rec
		if rec.DiffID != "" {
			s.byDiff[rec.DiffID] = rec.ID
		}
		cur = rec
	}
	for _, ref := range refs {
		if old, ok := s.idx.Refs[ref]; ok && old != cur.ID {
			if o, ok := s.idx.Entries[old]; ok {
				o.Refs = slices.DeleteFunc(o.Refs, func(r string) bool { return r == ref })
			}
		}
		s.idx.Refs[ref] = cur.ID
		if !slices.Contains(cur.Refs, ref) {
			cur.Refs = append(cur.Refs, ref)
		}
	}
	// A bare layer is only worth persisting together with the image that
	// uses it: until then a crash leaves an orphan directory that Open
	// removes. This saves one fsync per layer.
	if rec.App || len(refs) > 0 {
		if err := s.saveLocked(); err != nil {
			return nil, err
		}
	}
	return s.public(cur), nil
}

func writeManifest(path string, rec *record) error {
	b, err := jsonMarshal(rec.Manifest)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}
