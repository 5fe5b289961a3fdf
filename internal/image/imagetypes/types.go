// Package imagetypes holds the image store's types and its Store
// interface, without the store itself: the CLI and the API client name
// them without linking the store's registry client and its dependencies
// (every package linked costs each kurma command its init at start-up).
// Package image re-exports them under the same names.
//
// It must import nothing of this module but pkg/appc.
package imagetypes

import (
	"context"
	"time"

	"kurma.dev/kurma/pkg/appc"
)

// Image is one entry of the store. Every entry is addressed by its appc image
// ID ("sha512-<hex>"), which is also its directory name under /layers in a
// stager's root. An entry is either
//   - a layer: an extracted root filesystem (an OCI layer, or an ACI's
//     rootfs) with a minimal manifest; or
//   - an app image: what a user pulls (an OCI image, or an ACI); its
//     Manifest carries App (exec, env, user...) and Dependencies naming the
//     entries below it, top-most first.
//
// An ACI is both at once (it has a rootfs and an app). An OCI image becomes
// one app-image entry with an empty rootfs plus one layer entry per layer.
type Image struct {
	ID       string             `json:"id"`
	Name     string             `json:"name"`
	Manifest appc.ImageManifest `json:"manifest"`
	// HasRootfs is false for manifest-only app images (OCI): they add nothing
	// to the filesystem and are left out of Resolve's layer order.
	HasRootfs bool      `json:"hasRootfs"`
	Size      int64     `json:"size"`
	Created   time.Time `json:"created"`
	// Source is the URI the image was pulled from, and Refs the names that
	// point at it (e.g. "docker://registry/repo:tag").
	Source string   `json:"source,omitempty"`
	Refs   []string `json:"refs,omitempty"`
}

// Progress reports a pull as it goes; the CLI draws it.
type Progress struct {
	// Ref is the layer or blob being fetched, or "" for the image as a whole.
	Ref     string `json:"ref"`
	Status  string `json:"status"` // "resolving", "fetching", "extracting", "done", "cached"
	Current int64  `json:"current"`
	Total   int64  `json:"total"` // 0 when unknown
}

// PullOptions tunes a pull.
type PullOptions struct {
	// Progress, when set, is called as the pull advances (from one goroutine
	// at a time).
	Progress func(Progress)
	// RequireSignature demands a detached signature by a key of Keyring
	// (used for stager images). Signature URI: the image URI + ".sig".
	RequireSignature bool
	// Insecure allows plain-HTTP registries (tests).
	Insecure bool
}

// Layer is one entry of an app's filesystem, as Resolve returns it.
type Layer struct {
	ID       string
	Manifest appc.ImageManifest
	// Path is the extracted root filesystem on the host.
	Path string
}

// Store is the content-addressed image store the daemon uses. Errors wrap the
// kerrors categories: NotFound for an unknown ID or reference, Invalid for a
// malformed URI or a rejected tarball, Unauthorized for a missing or bad
// signature, Unavailable when a source cannot be reached.
type Store interface {
	// Pull fetches uri (docker://, file://, http(s)://; OCI layout, image
	// tarball or .aci) unless an image with that reference is already stored,
	// and returns the app image.
	Pull(ctx context.Context, uri string, opts PullOptions) (*Image, error)
	// Get returns an entry by ID, by reference, or by unique ID prefix.
	Get(ctx context.Context, idOrRef string) (*Image, error)
	// List returns the app images (not bare layers).
	List(ctx context.Context) ([]*Image, error)
	// Remove deletes an app image and every layer no other image uses.
	// It refuses (Conflict) while a lease holds the image.
	Remove(ctx context.Context, idOrRef string) error
	// Resolve returns the layers making up an image's filesystem, top-most
	// first, with their host paths; entries without a rootfs are skipped.
	Resolve(ctx context.Context, id string) ([]Layer, error)
	// Lease marks images in use by a pod so Remove refuses them; release
	// with Unlease. Leases persist across daemon restarts.
	Lease(ctx context.Context, holder string, ids ...string) error
	Unlease(ctx context.Context, holder string) error
}
