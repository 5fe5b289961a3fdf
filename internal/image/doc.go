// Package image is Kurma's content-addressed image store: it fetches images
// (docker://, file://, http(s)://; OCI layouts, image tarballs and ACIs),
// verifies signatures where trust is required, extracts layers safely and
// hands the daemon the ordered layers of an app's filesystem.
//
// It must not import the pod manager, the API or anything network-related.
package image
