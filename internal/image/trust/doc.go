// Package trust holds Kurma's image signing keys and detached signatures.
//
// Kurma deliberately uses ed25519 instead of AppC's GPG (see
// docs/image-trust.md). What is signed is the image ID string
// ("sha512-<hex>", the sha512 of the uncompressed ACI), prefixed with a
// domain-separation tag (SignedMessage). File formats, one line each:
//
//	public key:  "kurma-ed25519-pub <base64 32-byte key>"
//	private key: "kurma-ed25519-key <base64 32-byte seed>"
//	signature:   "kurma-ed25519-sig <base64 8-byte key id> <base64 64-byte signature>"
//
// A Keyring is immutable once built and safe for concurrent use. This
// package imports no other Kurma package but kerrors.
//
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`).
package trust
