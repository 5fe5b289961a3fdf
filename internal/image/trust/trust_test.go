package trust_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kurma.dev/kurma/internal/image/trust"
	"kurma.dev/kurma/pkg/kerrors"
)

const id = "sha512-0123456789abcdef0123456789abcdef"

func TestSignVerify(t *testing.T) {
	privA, pubA, err := trust.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	privB, pubB, _ := trust.GenerateKey()
	keyA, err := trust.ParsePrivateKey(privA)
	if err != nil {
		t.Fatal(err)
	}
	keyB, _ := trust.ParsePrivateKey(privB)
	dir := t.TempDir()
	pubFile := filepath.Join(dir, "a.pub")
	if err := os.WriteFile(pubFile, pubA, 0o644); err != nil {
		t.Fatal(err)
	}
	ring, err := trust.LoadKeyring(pubFile, strings.TrimSpace(string(pubB)))
	if err != nil || ring.Len() != 2 {
		t.Fatalf("LoadKeyring = %v, %v", ring, err)
	}
	onlyA, _ := trust.LoadKeyring(pubFile)
	sigA := trust.Sign(keyA, id)
	tests := []struct {
		name string
		ring *trust.Keyring
		id   string
		sig  []byte
		ok   bool
	}{
		{"good", onlyA, id, sigA, true},
		{"second key of ring", ring, id, trust.Sign(keyB, id), true},
		{"other key", onlyA, id, trust.Sign(keyB, id), false},
		{"other image", onlyA, id + "00", sigA, false},
		{"empty ring", trust.NewKeyring(), id, sigA, false},
		{"nil ring", nil, id, sigA, false},
		{"garbage", onlyA, id, []byte("kurma-ed25519-sig x y"), false},
		{"empty", onlyA, id, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ring.Verify(tc.id, tc.sig)
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !errors.Is(err, kerrors.Unauthorized) {
				t.Fatalf("Verify = %v, want Unauthorized", err)
			}
		})
	}
	for _, bad := range []string{"kurma-ed25519-pub AAAA", "ssh-ed25519 AAAA", pubFile + ".missing"} {
		if _, err := trust.LoadKeyring(bad); err == nil {
			t.Errorf("LoadKeyring(%q) accepted", bad)
		}
	}
	if _, err := trust.ParsePrivateKey(pubA); err == nil {
		t.Error("public key accepted as private")
	}
}

func FuzzVerify(f *testing.F) {
	priv, pub, _ := trust.GenerateKey()
	key, _ := trust.ParsePrivateKey(priv)
	pk, _ := trust.ParsePublicKey(pub)
	ring := trust.NewKeyring(pk)
	f.Add(trust.Sign(key, id))
	f.Add([]byte("kurma-ed25519-sig AAAAAAAAAAA= AAAA"))
	f.Add(pub)
	f.Fuzz(func(t *testing.T, sig []byte) {
		err := ring.Verify(id, sig)
		if err != nil && !errors.Is(err, kerrors.Unauthorized) {
			t.Fatalf("error %v is not Unauthorized", err)
		}
		_, _ = trust.ParsePublicKey(sig)
		_, _ = trust.ParsePrivateKey(sig)
	})
}
