package publicid_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idrange/idrange/publicid"
)

// fixedSecret is a test key's secret: SHA-256 of label, so tests and the
// committed vectors are reproducible.
func fixedSecret(label string) []byte {
	s := sha256.Sum256([]byte("idrange publicid test key: " + label))
	return s[:]
}

// testKeys is the key set of ids, each with fixedSecret(prefix+id).
func testKeys(t testing.TB, prefix string, primary int, ids ...int) *publicid.KeySet {
	t.Helper()
	secrets := map[int][]byte{}
	for _, id := range ids {
		secrets[id] = fixedSecret(fmt.Sprint(prefix, id))
	}
	ks, err := publicid.NewKeySet(primary, secrets)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func testCodec(t testing.TB, ks *publicid.KeySet, kind string) *publicid.Codec {
	t.Helper()
	c, err := publicid.NewCodec(ks, kind)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestNewKeySetRefusesBadKeys(t *testing.T) {
	good := fixedSecret("a")
	for _, tc := range []struct {
		name    string
		primary int
		secrets map[int][]byte
		msg     string
	}{
		{"none", 0, nil, "no keys"},
		{"id too large", 62, map[int][]byte{62: good}, "key id 62 not in 0..61"},
		{"negative id", -1, map[int][]byte{-1: good}, "key id -1 not in 0..61"},
		{"short secret", 0, map[int][]byte{0: good[:16]}, "key 0: secret is 16 bytes, want 32"},
		{"long secret", 0, map[int][]byte{0: append(slices.Clone(good), 1)}, "secret is 33 bytes, want 32"},
		{"zero secret", 0, map[int][]byte{0: make([]byte, 32)}, "key 0: secret is all zeros"},
		{"same secret twice", 0, map[int][]byte{0: good, 5: good}, "key 5 has the same secret as key 0"},
		{"primary not a key", 3, map[int][]byte{0: good, 1: fixedSecret("b")}, "primary key 3 is not one of the keys (0 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := publicid.NewKeySet(tc.primary, tc.secrets)
			if !errors.Is(err, publicid.ErrInvalidKeys) || !strings.Contains(err.Error(), tc.msg) || ks != nil {
				t.Fatalf("NewKeySet: %v, %v; want ErrInvalidKeys saying %q", ks, err, tc.msg)
			}
			if strings.Contains(err.Error(), b64(good)) || strings.Count(err.Error(), "\n") > 0 {
				t.Fatalf("error %q shows a secret or spans lines", err)
			}
		})
	}
}

// keyLine is a key file line for id with fixedSecret(label).
func keyLine(id int, label string) string {
	return fmt.Sprintf("key %d %s\n", id, b64(fixedSecret(label)))
}

func TestParseKeyFileRefusesBadFiles(t *testing.T) {
	k0, k1 := keyLine(0, "a"), keyLine(1, "b")
	for _, tc := range []struct{ name, text, msg string }{
		{"empty", "", "no keys"},
		{"comments only", "# nothing\n\n", "no keys"},
		{"no primary", k0 + k1, "no primary line"},
		{"two primaries", k0 + k1 + "primary 0\nprimary 1\n", "line 4: a second primary line (the first is line 3)"},
		{"primary not a key", k0 + k1 + "primary 7\n", "line 3: primary key 7 is not one of the keys (0 1)"},
		{"primary not a number", k0 + "primary x\n", "line 2: primary: key id is not a number in 0..61"},
		{"primary fields", k0 + "primary 0 1\n", "line 2: a primary line has 3 fields, want 2"},
		{"key fields", "key 0\nprimary 0\n", "line 1: a key line has 2 fields, want 3"},
		{"trailing comment", strings.TrimSuffix(k0, "\n") + " # old\nprimary 0\n", "line 1: a key line has 5 fields, want 3"},
		{"id not a number", "key x " + b64(fixedSecret("a")) + "\nprimary 0\n", "line 1: key id is not a number in 0..61"},
		{"id with sign", "key +1 " + b64(fixedSecret("a")) + "\nprimary 1\n", "line 1: key id is not a number in 0..61"},
		{"id leading zero", "key 01 " + b64(fixedSecret("a")) + "\nprimary 1\n", "line 1: key id is not a number in 0..61"},
		{"id too large", "key 62 " + b64(fixedSecret("a")) + "\nprimary 62\n", "line 1: key id is not a number in 0..61"},
		{"bad base64", "key 0 !!notbase64!!\nprimary 0\n", "line 1: key 0: secret is not standard base64"},
		{"url base64", "key 0 " + base64.URLEncoding.EncodeToString(fixedSecret("x")) + "\nprimary 0\n", "key 0: secret is not standard base64"},
		{"unpadded", "key 0 " + strings.TrimRight(b64(fixedSecret("a")), "=") + "\nprimary 0\n", "line 1: key 0: secret is not standard base64"},
		{"short key", "key 0 " + b64(make([]byte, 16)) + "\nprimary 0\n", "line 1: key 0: secret is 16 bytes, want 32"},
		{"zero key", "key 0 " + b64(make([]byte, 32)) + "\nprimary 0\n", "line 1: key 0: secret is all zeros"},
		{"duplicate id", k0 + k1 + keyLine(0, "c") + "primary 0\n", "line 3: key 0 given twice (also line 1)"},
		{"duplicate secret", k0 + keyLine(4, "a") + "primary 0\n", "line 2: key 4 has the same secret as key 0"},
		{"pasted secret", b64(fixedSecret("a")) + "\n" + k0 + "primary 0\n", "line 1: not a key line, a primary line or a # comment"},
		{"unknown statement", k0 + "primary 0\nfoo bar\n", "line 3: not a key line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := publicid.ParseKeyFile([]byte(tc.text))
			if !errors.Is(err, publicid.ErrInvalidKeys) || !strings.Contains(err.Error(), tc.msg) || ks != nil {
				t.Fatalf("ParseKeyFile: %v, %v; want ErrInvalidKeys saying %q", ks, err, tc.msg)
			}
			for _, label := range []string{"a", "b", "c", "x"} {
				if strings.Contains(err.Error(), b64(fixedSecret(label))[:20]) {
					t.Fatalf("error %q shows a secret", err)
				}
			}
		})
	}
}

func TestKeyFileRoundTrip(t *testing.T) {
	ks := testKeys(t, "rt", 5, 0, 5, 61)
	text := ks.KeyFile()
	back, err := publicid.ParseKeyFile(text)
	if err != nil {
		t.Fatalf("ParseKeyFile(KeyFile()): %v\n%s", err, text)
	}
	if back.Primary() != 5 || !slices.Equal(back.IDs(), []int{0, 5, 61}) || !slices.Equal(back.KeyFile(), text) {
		t.Fatalf("read back %v, want %v; file\n%s", back, ks, text)
	}
	// The same keys: tokens agree.
	if a, b := testCodec(t, ks, "order").Encode(42), testCodec(t, back, "order").Encode(42); a != b {
		t.Fatalf("token %s after a round trip, %s before", b, a)
	}
	// Comments, blank lines, tabs and CRLF are accepted.
	loose := "# keys\r\n\r\nkey\t61 " + b64(fixedSecret("rt61")) + "  \r\n  primary 61\r\n"
	if ks, err := publicid.ParseKeyFile([]byte(loose)); err != nil || ks.Primary() != 61 {
		t.Fatalf("ParseKeyFile(%q): %v, %v", loose, ks, err)
	}

	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, text, 0o600); err != nil {
		t.Fatal(err)
	}
	if back, err := publicid.ReadKeyFile(path); err != nil || back.Primary() != 5 {
		t.Fatalf("ReadKeyFile: %v, %v", back, err)
	}
	if err := os.WriteFile(path, []byte("primary 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := publicid.ReadKeyFile(path); !errors.Is(err, publicid.ErrInvalidKeys) || !strings.Contains(err.Error(), path+": no keys") {
		t.Fatalf("ReadKeyFile of a file without keys: %v", err)
	}
	if _, err := publicid.ReadKeyFile(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadKeyFile of a missing file: %v", err)
	}
}

// No fmt verb prints a secret, on the value or the pointer.
func TestKeySetFormatHidesSecrets(t *testing.T) {
	ks := testKeys(t, "fmt", 1, 0, 1)
	secret := fixedSecret("fmt1")
	forms := []string{b64(secret), hex.EncodeToString(secret), fmt.Sprint(secret[:4])[1:8], fmt.Sprintf("%x", secret[:4])}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%q"} {
		for _, v := range []any{ks, *ks} {
			out := fmt.Sprintf(verb, v)
			if out != "publicid.KeySet{keys: 0 1, primary: 1}" {
				t.Errorf("%s of %T: %q", verb, v, out)
			}
			for _, f := range forms {
				if strings.Contains(out, f) {
					t.Errorf("%s of %T shows the secret: %q", verb, v, out)
				}
			}
		}
	}
}

func TestAddKeyAndWithPrimary(t *testing.T) {
	ks := publicid.GenerateKeySet()
	if ks.Primary() != 0 || !slices.Equal(ks.IDs(), []int{0}) {
		t.Fatalf("GenerateKeySet: %v", ks)
	}
	ks1, id, err := ks.AddKey()
	if err != nil || id != 1 || ks1.Primary() != 0 || !slices.Equal(ks1.IDs(), []int{0, 1}) {
		t.Fatalf("AddKey: %v, %d, %v; want keys 0 1, new id 1, primary still 0", ks1, id, err)
	}
	if !slices.Equal(ks.IDs(), []int{0}) {
		t.Fatalf("AddKey changed its receiver: %v", ks)
	}
	if _, err := ks1.WithPrimary(7); !errors.Is(err, publicid.ErrInvalidKeys) {
		t.Fatalf("WithPrimary(7): %v", err)
	}
	// The new id is the first free one after the primary, cyclically.
	wrap := testKeys(t, "wrap", 61, 1, 60, 61)
	if _, id, err := wrap.AddKey(); err != nil || id != 0 {
		t.Fatalf("AddKey after primary 61: id %d, %v; want 0", id, err)
	}
	staged := testKeys(t, "staged", 3, 3, 4)
	if _, id, err := staged.AddKey(); err != nil || id != 5 {
		t.Fatalf("AddKey after primary 3 with 4 staged: id %d, %v; want 5", id, err)
	}
	all := map[int][]byte{}
	for id := range publicid.MaxKeyID + 1 {
		all[id] = fixedSecret(fmt.Sprint("full", id))
	}
	full, err := publicid.NewKeySet(0, all)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := full.AddKey(); err == nil || !strings.Contains(err.Error(), "every key id 0..61 is in use") {
		t.Fatalf("AddKey on a full set: %v", err)
	}
	// Random keys differ.
	a, b := publicid.GenerateKeySet(), publicid.GenerateKeySet()
	if testCodec(t, a, "k").Encode(1) == testCodec(t, b, "k").Encode(1) {
		t.Fatal("two generated keys give the same token")
	}
}
