// Package image is Kurma's content-addressed image store: it fetches images
// (docker://, file://, http(s)://; OCI layouts, OCI archives, docker-save
// tarballs and ACIs, plain or gzip/bzip2/zstd), verifies signatures where
// trust is required, extracts layers safely (package tarx) and hands the
// daemon the ordered layers of an app's filesystem. Its types (Image,
// Progress, PullOptions, Layer) and the Store interface are defined in the
// leaf package imagetypes and aliased here; code that only names them
// (the CLI, the API, the pod manager) imports imagetypes, so that it does
// not link this package and its registry client.
//
// # IDs
//
// Every entry is named by an appc image ID, "sha512-<hex>", which is also its
// directory name under /layers in a stager's root:
//   - an ACI: sha512 of the whole uncompressed ACI tar (as appc defines it);
//   - an OCI layer: sha512 of the uncompressed layer tar, computed while
//     extracting (its sha256 is checked against the config's diffID);
//   - an OCI image's app entry: sha512 of the raw config blob. The config
//     lists every layer's diffID, so it pins the filesystem as well as the
//     run settings; the manifest's bytes vary with compression, the config's
//     do not, so the same image pulled from a registry, a layout or a
//     docker-save tarball gets the same ID.
//
// # Layout and crash safety
//
// See FSStore. Work happens in tmp/ and is renamed into entries/ before
// index.json is atomically replaced; Open removes tmp/ and any entry the
// index does not know, so nothing half-written survives a crash.
//
// # Locking
//
// One process at a time: Open flocks <root>/lock (LOCK_EX|LOCK_NB) before
// it cleans anything, and a second Open, here or elsewhere, gets
// kerrors.Conflict; Close releases it.
//
// FSStore.mu guards the in-memory index (entries, refs, leases, the diffID
// map and the Resolve cache) and serialises index writes and renames into
// entries/. Network fetches and extraction run without it. Concurrent pulls
// of one URI, and concurrent extractions of one layer (keyed by diffID),
// are collapsed with singleflight; commit re-checks under mu so an entry is
// never written twice. Get, List and Resolve read only memory.
//
// # Size
//
// Options.MaxLayerBytes (default tarx.DefaultMaxBytes) bounds every tar
// stream a pull extracts; more is kerrors.Invalid and stores nothing.
//
// # Trust
//
// PullOptions.RequireSignature applies the stager rule: a detached ed25519
// signature at URI+".sig" over the image ID by a key of Options.Keyring, and
// no dependencies; anything else is kerrors.Unauthorized and stores nothing.
// See package trust and docs/image-trust.md.
//
// # Modules
//
// go-containerregistry (already required) needs klauspost/compress,
// opencontainers/go-digest and image-spec, and docker/cli with
// docker-credential-helpers (registry credentials) in go.sum; they were
// added with `go get` of its packages. This package also imports
// klauspost/compress/zstd directly to read zstd-compressed layers and ACIs.
//
// Must not import: `kurma.dev/kurma/internal/pod`,
// `kurma.dev/kurma/internal/api/...`, `kurma.dev/kurma/internal/network/...`,
// `kurma.dev/kurma/internal/agent/...`,
// `kurma.dev/kurma/internal/controller/...`.
package image
