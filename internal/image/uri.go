package image

import (
	"net/url"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"kurma.dev/kurma/pkg/kerrors"
)

// Source schemes.
const (
	SchemeDocker = "docker"
	SchemeFile   = "file"
	SchemeHTTP   = "http"
	SchemeHTTPS  = "https"
)

// URI is a parsed image URI.
type URI struct {
	Scheme string
	// Raw is the URI as given.
	Raw string
	// Canonical is the form stored as a reference: docker://<full ref>,
	// file://<clean absolute path>, or the http(s) URL.
	Canonical string
	// Path is the local path (file).
	Path string
	// Ref is the registry reference (docker).
	Ref name.Reference
}

// ParseURI parses docker://, file:// and http(s):// image URIs. A bare
// absolute path is taken as file://. "docker:///user/name:tag" (three
// slashes) names Docker Hub; "docker://host[:port]/repo[:tag|@digest]" a
// registry. insecure allows plain-HTTP registries.
func ParseURI(raw string, insecure bool) (URI, error) {
	u, err := parseURI(raw, insecure)
	if err == nil && badText(u.Canonical) {
		err = kerrors.New(kerrors.Invalid, "image URI %q: canonical form %q is not usable", raw, u.Canonical)
	}
	return u, err
}

func badText(s string) bool {
	return s == "" || strings.ContainsAny(s, "\x00\n\r") || strings.TrimSpace(s) != s
}

func parseURI(raw string, insecure bool) (URI, error) {
	u := URI{Raw: raw}
	if badText(raw) {
		return u, kerrors.New(kerrors.Invalid, "image URI %q: empty or contains control characters", raw)
	}
	switch {
	case strings.HasPrefix(raw, "/"):
		return parseFile(u, raw)
	case strings.HasPrefix(raw, "file://"):
		p := strings.TrimPrefix(raw, "file://")
		if !strings.HasPrefix(p, "/") {
			return u, kerrors.New(kerrors.Invalid, "image URI %q: file:// needs an absolute path (file:///path)", raw)
		}
		return parseFile(u, p)
	case strings.HasPrefix(raw, "docker://"):
		u.Scheme = SchemeDocker
		r := strings.TrimPrefix(strings.TrimPrefix(raw, "docker://"), "/")
		if r == "" {
			return u, kerrors.New(kerrors.Invalid, "image URI %q: no repository", raw)
		}
		var opts []name.Option
		if insecure {
			opts = append(opts, name.Insecure)
		}
		ref, err := name.ParseReference(r, opts...)
		if err != nil {
			return u, kerrors.New(kerrors.Invalid, "image URI %q: %v", raw, err)
		}
		u.Ref = ref
		u.Canonical = "docker://" + ref.Name()
		return u, nil
	case strings.HasPrefix(raw, "http://"), strings.HasPrefix(raw, "https://"):
		pu, err := url.Parse(raw)
		if err != nil || pu.Host == "" {
			return u, kerrors.New(kerrors.Invalid, "image URI %q: bad URL", raw)
		}
		u.Scheme = pu.Scheme
		pu.Fragment = ""
		u.Canonical = pu.String()
		return u, nil
	}
	return u, kerrors.New(kerrors.Invalid, "image URI %q: unsupported scheme (want docker://, file:// or http(s)://)", raw)
}

func parseFile(u URI, p string) (URI, error) {
	u.Scheme = SchemeFile
	u.Path = filepath.Clean(p)
	if u.Path == "/" {
		return u, kerrors.New(kerrors.Invalid, "image URI %q: not an image path", u.Raw)
	}
	u.Canonical = "file://" + u.Path
	return u, nil
}

// String returns the canonical form.
func (u URI) String() string { return u.Canonical }

// sigURI is where a detached signature lives for u.
func (u URI) sigURI() (string, error) {
	switch u.Scheme {
	case SchemeFile:
		return u.Path + ".sig", nil
	case SchemeHTTP, SchemeHTTPS:
		return u.Canonical + ".sig", nil
	}
	return "", kerrors.New(kerrors.Unauthorized, "image %s: signatures are supported for file:// and http(s):// images only", u.Raw)
}

func errf(cat error, format string, args ...any) error { return kerrors.New(cat, format, args...) }
