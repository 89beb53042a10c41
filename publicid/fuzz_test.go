package publicid_test

import (
	"errors"
	"testing"

	"github.com/idrange/idrange/publicid"
)

// FuzzDecode: Decode never panics, fails only with its three sentinels,
// and accepts nothing but the exact tokens Encode writes: a mutated token
// that decodes would be a forgery (probability 2^-64 each) or a second
// spelling (a bug). The seeds are valid tokens of the codec's keys, other
// kinds and keys, and near-misses (scripts/fuzz runs it in CI).
func FuzzDecode(f *testing.F) {
	ks := testKeys(f, "fuzz", 1, 0, 1, 61)
	c := testCodec(f, ks, "order")
	for _, id := range []int64{1, 4194304, 153652455016566789, 1<<63 - 1, -1} {
		tok := c.Encode(id)
		f.Add(tok)
		f.Add(tok[:len(tok)-1] + "B")
		f.Add(testCodec(f, ks, "user").Encode(id))
		f.Add(testCodec(f, testKeys(f, "fuzz", 61, 0, 1, 61), "order").Encode(id))
	}
	f.Add("")
	f.Add("B=======================")
	f.Fuzz(func(t *testing.T, token string) {
		id, err := c.Decode(token)
		if err != nil {
			if !errors.Is(err, publicid.ErrMalformed) && !errors.Is(err, publicid.ErrUnknownKey) && !errors.Is(err, publicid.ErrNotAuthentic) {
				t.Fatalf("Decode(%q): %v, not one of the sentinels", token, err)
			}
			if id != 0 {
				t.Fatalf("Decode(%q) failed but returned %d", token, id)
			}
			return
		}
		// Accepted: it must be the token Encode writes for id under the key
		// it names (the primary's tokens, or key 0's or 61's).
		if token[0] == 'B' {
			if want := c.Encode(id); token != want {
				t.Fatalf("Decode(%q) = %d, but that ID's token is %q: a second spelling or a forgery", token, id, want)
			}
			return
		}
		for _, p := range []int{0, 61} {
			other := testCodec(t, testKeys(t, "fuzz", p, 0, 1, 61), "order")
			if other.Encode(id) == token {
				return
			}
		}
		t.Fatalf("Decode(%q) = %d, but no key of the set makes that token for it", token, id)
	})
}
