package trust

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

const (
	pubTag  = "kurma-ed25519-pub"
	keyTag  = "kurma-ed25519-key"
	sigTag  = "kurma-ed25519-sig"
	msgTag  = "kurma-image-id-v1:"
	idBytes = 8
)

// SignedMessage is what a signature covers for an image ID.
func SignedMessage(imageID string) []byte { return []byte(msgTag + imageID) }

// KeyID is a short fingerprint of a public key (first 8 bytes of its sha256).
func KeyID(pub ed25519.PublicKey) []byte {
	s := sha256.Sum256(pub)
	return s[:idBytes]
}

// GenerateKey returns a new key pair encoded in the file formats.
func GenerateKey() (priv, pub []byte, err error) {
	p, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	priv = []byte(keyTag + " " + base64.StdEncoding.EncodeToString(k.Seed()) + "\n")
	pub = []byte(pubTag + " " + base64.StdEncoding.EncodeToString(p) + "\n")
	return priv, pub, nil
}

func parseLine(data []byte, tag string, fields int) ([]string, error) {
	f := strings.Fields(strings.TrimSpace(string(data)))
	if len(f) != fields+1 || f[0] != tag {
		return nil, kerrors.New(kerrors.Invalid, "not a %q line", tag)
	}
	return f[1:], nil
}

// ParsePrivateKey reads a private key file's content.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	f, err := parseLine(data, keyTag, 1)
	if err != nil {
		return nil, err
	}
	seed, err := base64.StdEncoding.DecodeString(f[0])
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, kerrors.New(kerrors.Invalid, "bad private key encoding")
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// ParsePublicKey reads a public key file's content.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	f, err := parseLine(data, pubTag, 1)
	if err != nil {
		return nil, err
	}
	k, err := base64.StdEncoding.DecodeString(f[0])
	if err != nil || len(k) != ed25519.PublicKeySize {
		return nil, kerrors.New(kerrors.Invalid, "bad public key encoding")
	}
	return ed25519.PublicKey(k), nil
}

// Sign returns a signature file's content for imageID.
func Sign(key ed25519.PrivateKey, imageID string) []byte {
	sig := ed25519.Sign(key, SignedMessage(imageID))
	id := KeyID(key.Public().(ed25519.PublicKey))
	return []byte(sigTag + " " + base64.StdEncoding.EncodeToString(id) + " " +
		base64.StdEncoding.EncodeToString(sig) + "\n")
}

// Keyring is a set of trusted public keys.
type Keyring struct {
	keys []ed25519.PublicKey
}

// NewKeyring builds a keyring from public keys.
func NewKeyring(keys ...ed25519.PublicKey) *Keyring {
	return &Keyring{keys: append([]ed25519.PublicKey(nil), keys...)}
}

// LoadKeyring reads public key files, or inline key lines: an entry that
// starts with the public key tag is parsed as a key, anything else is a path.
func LoadKeyring(entries ...string) (*Keyring, error) {
	kr := &Keyring{}
	for _, e := range entries {
		data := []byte(e)
		if !strings.HasPrefix(strings.TrimSpace(e), pubTag) {
			b, err := os.ReadFile(e)
			if err != nil {
				return nil, fmt.Errorf("read trusted key: %w", err)
			}
			data = b
		}
		k, err := ParsePublicKey(data)
		if err != nil {
			return nil, fmt.Errorf("trusted key %q: %w", e, err)
		}
		kr.keys = append(kr.keys, k)
	}
	return kr, nil
}

// Len is the number of keys.
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.keys)
}

// Verify checks a signature file's content against imageID; it fails with
// kerrors.Unauthorized unless a key of the ring made the signature.
func (k *Keyring) Verify(imageID string, sigFile []byte) error {
	_, err := k.VerifyKey(imageID, sigFile)
	return err
}

// VerifyKey is Verify that also returns the hex key ID of the key that made
// the signature.
func (k *Keyring) VerifyKey(imageID string, sigFile []byte) (string, error) {
	if k.Len() == 0 {
		return "", kerrors.New(kerrors.Unauthorized, "no trusted keys configured; cannot verify %s", imageID)
	}
	f, err := parseLine(sigFile, sigTag, 2)
	if err != nil {
		return "", kerrors.New(kerrors.Unauthorized, "malformed signature for %s", imageID)
	}
	sig, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "", kerrors.New(kerrors.Unauthorized, "malformed signature for %s", imageID)
	}
	msg := SignedMessage(imageID)
	for _, pub := range k.keys {
		if ed25519.Verify(pub, msg, sig) {
			return hex.EncodeToString(KeyID(pub)), nil
		}
	}
	return "", kerrors.New(kerrors.Unauthorized, "signature of %s is not by a trusted key (key id %s)", imageID, f[0])
}

// HasKeyID reports whether a key with this hex key ID is in the ring.
func (k *Keyring) HasKeyID(id string) bool {
	if k == nil {
		return false
	}
	for _, pub := range k.keys {
		if hex.EncodeToString(KeyID(pub)) == id {
			return true
		}
	}
	return false
}
