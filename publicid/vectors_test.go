package publicid_test

import (
	"bytes"
	"crypto/aes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strconv"
	"testing"

	"github.com/idrange/idrange/publicid"
	"github.com/idrange/idrange/snowflake"
)

// vectorsFile holds the known-answer vectors: other implementations
// (examples/node) decode and encode them; the tests below check the
// package against them.
const vectorsFile = "testdata/vectors.json"

var update = flag.Bool("update", false, "rewrite "+vectorsFile+" (go test ./publicid -run TestVectors -update); only for a deliberate change of the vectors: a change of the construction breaks every token ever issued")

// vectors is the vectors file's content.
type vectors struct {
	About   string          `json:"about"`
	Keys    []vectorKey     `json:"keys"`
	Tokens  []vectorToken   `json:"tokens"`
	Refused []vectorRefusal `json:"refused"`
}

type vectorKey struct {
	ID     int    `json:"id"`
	Secret string `json:"secret"` // standard base64, as in a key file
}

type vectorToken struct {
	Key   int    `json:"key"` // the key that made it (the primary)
	Kind  string `json:"kind"`
	ID    string `json:"id"` // decimal: JavaScript numbers lose 64-bit precision
	Token string `json:"token"`
}

type vectorRefusal struct {
	Kind  string `json:"kind"`
	Token string `json:"token"`
	Error string `json:"error"` // errorNames
	Why   string `json:"why"`
}

// errorNames name Decode's sentinels in the vectors.
var errorNames = map[string]error{
	"malformed":     publicid.ErrMalformed,
	"unknown key":   publicid.ErrUnknownKey,
	"not authentic": publicid.ErrNotAuthentic,
}

const vectorsAbout = "Known-answer vectors of idrange's public-ID tokens (package publicid, format 1; " +
	"docs/public-ids.md). Each key decodes every token that names its id; a token was made with " +
	"key `key` as the primary. IDs are decimal int64. Every `refused` token must fail with its error."

// makeVectors computes the vectors from fixed keys: the same every run.
func makeVectors(t *testing.T) vectors {
	v := vectors{About: vectorsAbout}
	secrets := map[int][]byte{}
	keyIDs := []int{0, 1, 61}
	for _, id := range keyIDs {
		secrets[id] = fixedSecret("vector " + strconv.Itoa(id))
		v.Keys = append(v.Keys, vectorKey{ID: id, Secret: b64(secrets[id])})
	}
	codec := func(primary int, kind string) *publicid.Codec {
		ks, err := publicid.NewKeySet(primary, secrets)
		if err != nil {
			t.Fatal(err)
		}
		return testCodec(t, ks, kind)
	}
	typical, err := snowflake.Compose(snowflake.MsSince(snowflake.Epoch.AddDate(1, 2, 0)), 2, 17, 5)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int64{1, 1 << 22, int64(typical), int64(typical) + 1, 1<<63 - 1, 0, -1, -1 << 63}
	for _, key := range keyIDs {
		for _, kind := range []string{"order", "user", "invoice.v2"} {
			c := codec(key, kind)
			for _, id := range ids {
				v.Tokens = append(v.Tokens, vectorToken{Key: key, Kind: kind, ID: strconv.FormatInt(id, 10), Token: c.Encode(id)})
			}
		}
	}

	tok := codec(1, "order").Encode(int64(typical))
	set := func(i int, c byte) string { b := []byte(tok); b[i] = c; return string(b) }
	other := func(c byte) byte { // another alphabet character than c, same unused bits
		i := (bytes.IndexByte([]byte(alphabet), c) + 16) % 64
		return alphabet[i]
	}
	last := len(tok) - 1
	refuse := func(kind, token, err, why string) {
		v.Refused = append(v.Refused, vectorRefusal{Kind: kind, Token: token, Error: err, Why: why})
	}
	refuse("order", set(10, other(tok[10])), "not authentic", "one block character changed")
	refuse("order", set(last, other(tok[last])), "not authentic", "the last character changed, its unused bits still zero")
	refuse("order", set(last, alphabet[bytes.IndexByte([]byte(alphabet), tok[last])|1]), "malformed", "the last character's unused low bits set: a second spelling of the same block")
	refuse("order", set(0, alphabet[0]), "not authentic", "key id changed to another key of the set")
	refuse("order", set(0, alphabet[25]), "unknown key", "key id 25 (Z): no such key")
	refuse("order", set(0, '-'), "malformed", "first character is not a key id (only letters and digits are)")
	refuse("order", set(5, '+'), "malformed", "a standard-base64 character (+) instead of base64url")
	refuse("order", set(8, '\n'), "malformed", "a newline inside")
	refuse("order", tok[:last], "malformed", "truncated")
	refuse("order", tok+"A", "malformed", "extended")
	refuse("order", tok+"=", "malformed", "padded")
	refuse("order", "", "malformed", "empty")
	refuse("user", tok, "not authentic", "an order token decoded as a user token")
	refuse("Order", tok, "not authentic", "kinds are case-sensitive")
	return v
}

// marshalVectors writes v as JSON with one vector a line, so a diff of the
// file shows which vectors changed.
func marshalVectors(t *testing.T, v vectors) []byte {
	var b bytes.Buffer
	line := func(x any, sep string) {
		j, err := json.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("    ")
		b.Write(j)
		b.WriteString(sep + "\n")
	}
	list := func(name string, n int, item func(int) any, end string) {
		b.WriteString("  \"" + name + "\": [\n")
		for i := range n {
			sep := ","
			if i == n-1 {
				sep = ""
			}
			line(item(i), sep)
		}
		b.WriteString("  ]" + end + "\n")
	}
	about, err := json.Marshal(v.About)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString("{\n  \"about\": ")
	b.Write(about)
	b.WriteString(",\n")
	list("keys", len(v.Keys), func(i int) any { return v.Keys[i] }, ",")
	list("tokens", len(v.Tokens), func(i int) any { return v.Tokens[i] }, ",")
	list("refused", len(v.Refused), func(i int) any { return v.Refused[i] }, "")
	b.WriteString("}\n")
	return b.Bytes()
}

// The committed vectors are what makeVectors computes now (a change of the
// construction shows here first), and the package decodes and encodes each
// as the file says.
func TestVectors(t *testing.T) {
	want := marshalVectors(t, makeVectors(t))
	if *update {
		if err := os.WriteFile(vectorsFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", vectorsFile)
	}
	got, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from what the package computes now: the construction or the vectors changed. "+
			"If on purpose (it breaks every token issued), rerun with -update and say so in the changelog", vectorsFile)
	}
	var v vectors
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatal(err)
	}
	checkVectors(t, v)
}

// checkVectors decodes and encodes every vector of v with the package,
// reading the keys as a key file would hold them.
func checkVectors(t *testing.T, v vectors) {
	secrets := map[int][]byte{}
	for _, k := range v.Keys {
		s, err := base64.StdEncoding.DecodeString(k.Secret)
		if err != nil {
			t.Fatalf("key %d: %v", k.ID, err)
		}
		secrets[k.ID] = s
	}
	codecs := map[[2]string]*publicid.Codec{}
	codec := func(primary int, kind string) *publicid.Codec {
		key := [2]string{strconv.Itoa(primary), kind}
		if c := codecs[key]; c != nil {
			return c
		}
		ks, err := publicid.NewKeySet(primary, secrets)
		if err != nil {
			t.Fatal(err)
		}
		codecs[key] = testCodec(t, ks, kind)
		return codecs[key]
	}
	if len(v.Tokens) < 60 || len(v.Refused) < 10 {
		t.Fatalf("%d tokens and %d refusals: the file lost vectors", len(v.Tokens), len(v.Refused))
	}
	for _, tv := range v.Tokens {
		id, err := strconv.ParseInt(tv.ID, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		c := codec(tv.Key, tv.Kind)
		if got := c.Encode(id); got != tv.Token {
			t.Errorf("key %d, %s, ID %d: Encode = %q, want %q", tv.Key, tv.Kind, id, got, tv.Token)
		}
		if got, err := c.Decode(tv.Token); err != nil || got != id {
			t.Errorf("key %d, %s: Decode(%q) = %d, %v; want %d", tv.Key, tv.Kind, tv.Token, got, err, id)
		}
	}
	for _, r := range v.Refused {
		want := errorNames[r.Error]
		if want == nil {
			t.Fatalf("refused %q: unknown error name %q", r.Token, r.Error)
		}
		if got, err := codec(v.Keys[0].ID, r.Kind).Decode(r.Token); !errors.Is(err, want) {
			t.Errorf("%s (%q as %s): Decode = %d, %v; want %v", r.Why, r.Token, r.Kind, got, err, want)
		}
	}
}

// The construction as docs/public-ids.md states it, computed step by step
// with HMAC (RFC 5869's extract and expand written out) and one AES-256
// block, gives the package's tokens: the documentation and the code say the
// same thing.
func TestConstructionAsDocumented(t *testing.T) {
	secret := fixedSecret("vector 1")
	ks, err := publicid.NewKeySet(1, map[int][]byte{1: secret})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"order", "invoice.v2"} {
		c := testCodec(t, ks, kind)
		for _, id := range []int64{1, 567_890_123_456_789, -1} {
			// HKDF-SHA256, empty salt (= 32 zero bytes), info
			// "idrange publicid v1" 0x00 kind, 40 bytes (two HMAC blocks).
			prk := hmacSHA256(make([]byte, sha256.Size), secret)
			info := append([]byte("idrange publicid v1\x00"), kind...)
			t1 := hmacSHA256(prk, append(append([]byte{}, info...), 1))
			t2 := hmacSHA256(prk, append(append(append([]byte{}, t1...), info...), 2))
			okm := append(t1, t2...)[:40]
			aesKey, check := okm[:32], okm[32:40]

			block, err := aes.NewCipher(aesKey)
			if err != nil {
				t.Fatal(err)
			}
			var b [16]byte
			binary.BigEndian.PutUint64(b[:8], uint64(id))
			copy(b[8:], check)
			block.Encrypt(b[:], b[:])
			want := "B" + base64.RawURLEncoding.EncodeToString(b[:]) // key id 1 is "B"
			if got := c.Encode(id); got != want {
				t.Errorf("%s %d: Encode = %q, the documented construction gives %q", kind, id, got, want)
			}
		}
	}
}

func hmacSHA256(key, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return m.Sum(nil)
}
