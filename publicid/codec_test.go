package publicid_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/idrange/idrange/publicid"
)

// alphabet is the token alphabet (base64url), spelled out here so the tests
// do not read it from the code under test.
const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// kinds are the kinds the round trip covers: short, long, every allowed
// byte class, one differing from another only in case.
var kinds = []string{"order", "ORDER", "v2.order_line-item", strings.Repeat("k", publicid.MaxKindLen)}

// The acceptance's round trip: 1M random IDs (and the extremes) under every
// kind; each token is TokenLen characters of the alphabet starting with the
// primary's key id, and decodes to its ID. Four goroutines share the
// codecs (concurrent use, checked under -race).
func TestRoundTripMillionIDs(t *testing.T) {
	ks := testKeys(t, "rt", 7, 3, 7, 61)
	codecs := make([]*publicid.Codec, len(kinds))
	for i, k := range kinds {
		codecs[i] = testCodec(t, ks, k)
		if codecs[i].Kind() != k {
			t.Fatalf("Kind() = %q, want %q", codecs[i].Kind(), k)
		}
	}
	rng := rand.New(rand.NewPCG(36, 1))
	ids := []int64{0, 1, -1, math.MaxInt64, math.MinInt64, 4194304}
	for len(ids) < 1_000_000 {
		ids = append(ids, int64(rng.Uint64()))
	}
	const workers = 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(ids); i += workers {
				id := ids[i]
				for _, c := range codecs {
					tok := c.Encode(id)
					if len(tok) != publicid.TokenLen || tok[0] != alphabet[7] || strings.Trim(tok, alphabet) != "" {
						t.Errorf("%s token of %d = %q: want %d characters of the alphabet starting with %q", c.Kind(), id, tok, publicid.TokenLen, alphabet[7])
						return
					}
					if got, err := c.Decode(tok); err != nil || got != id {
						t.Errorf("%s: Decode(Encode(%d) = %q) = %d, %v", c.Kind(), id, tok, got, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// keyCharError is the error Decode must give for a token whose first
// character (the key id) is c, for a key set holding the ids in keys: a
// letter or digit names a key (not authentic if the set has it, since the
// rest was made for another key, unknown otherwise); anything else is
// malformed.
func keyCharError(c byte, keys map[int]bool) error {
	i := strings.IndexByte(alphabet, c)
	switch {
	case i < 0 || i > publicid.MaxKeyID:
		return publicid.ErrMalformed
	case keys[i]:
		return publicid.ErrNotAuthentic
	}
	return publicid.ErrUnknownKey
}

// The acceptance's refusals: every token changed in any single character
// (to every other byte), truncated, extended, decoded as another kind or
// under another key is refused, with the sentinel that says why.
func TestAlteredTokensAreRefused(t *testing.T) {
	ks := testKeys(t, "alt", 1, 0, 1, 2)
	held := map[int]bool{0: true, 1: true, 2: true}
	order, user := testCodec(t, ks, "order"), testCodec(t, ks, "user")
	ids := []int64{1, 4194304, 512_345_678_901_234_567, math.MaxInt64, -1}
	for _, id := range ids {
		tok := order.Encode(id)
		decodeFails := func(what, s string, c *publicid.Codec, want error) {
			t.Helper()
			got, err := c.Decode(s)
			if !errors.Is(err, want) {
				t.Fatalf("%s (%q as %s): Decode = %d, %v; want %v", what, s, c.Kind(), got, err, want)
			}
			if got != 0 || len(s) > 2 && strings.Contains(err.Error(), s) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s: Decode = %d, %q; want 0 and one line without the token", what, got, err)
			}
		}
		// One character changed, at every position, to every other byte.
		for i := range len(tok) {
			for c := range 256 {
				b := byte(c)
				if b == tok[i] {
					continue
				}
				s := tok[:i] + string([]byte{b}) + tok[i+1:]
				var want error
				v := strings.IndexByte(alphabet, b)
				switch {
				case i == 0:
					want = keyCharError(b, held)
				case v < 0:
					want = publicid.ErrMalformed
				case i == publicid.TokenLen-1 && v&0xf != 0:
					want = publicid.ErrMalformed // the unused low bits of the last character
				default:
					want = publicid.ErrNotAuthentic
				}
				decodeFails("changed", s, order, want)
			}
		}
		for n := range len(tok) {
			decodeFails("truncated", tok[:n], order, publicid.ErrMalformed)
			decodeFails("cut at the front", tok[len(tok)-n:], order, publicid.ErrMalformed)
		}
		for _, ext := range []string{"A", "=", "==", "\n", " ", tok} {
			decodeFails("extended", tok+ext, order, publicid.ErrMalformed)
			decodeFails("prefixed", ext+tok, order, publicid.ErrMalformed)
		}
		// Another kind, both ways, and kinds one byte apart.
		decodeFails("re-kinded", tok, user, publicid.ErrNotAuthentic)
		decodeFails("re-kinded", user.Encode(id), order, publicid.ErrNotAuthentic)
		for _, k := range []string{"Order", "orders", "orde", "order."} {
			decodeFails("re-kinded", tok, testCodec(t, ks, k), publicid.ErrNotAuthentic)
		}
		// Another key of the same id, and a key set without the id.
		decodeFails("another key", tok, testCodec(t, testKeys(t, "other", 1, 0, 1, 2), "order"), publicid.ErrNotAuthentic)
		decodeFails("key not held", tok, testCodec(t, testKeys(t, "alt", 0, 0, 2), "order"), publicid.ErrUnknownKey)
		// A token of another key of the same set, relabelled with the key id
		// of this one.
		other := testCodec(t, testKeys(t, "alt", 2, 0, 1, 2), "order").Encode(id)
		decodeFails("relabelled", tok[:1]+other[1:], order, publicid.ErrNotAuthentic)
	}
}

// The acceptance's rotation: after a new primary, old tokens still decode
// and new ones carry the new key id; a staged key decodes before it
// encodes; a retired key's tokens are refused as ErrUnknownKey.
func TestRotation(t *testing.T) {
	old := publicid.GenerateKeySet()
	before := testCodec(t, old, "order")
	ids := []int64{1, 2, 1 << 40, math.MaxInt64}
	oldTokens := map[int64]string{}
	for _, id := range ids {
		oldTokens[id] = before.Encode(id)
	}

	staged, newID, err := old.AddKey()
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := staged.WithPrimary(newID)
	if err != nil {
		t.Fatal(err)
	}
	during, after := testCodec(t, staged, "order"), testCodec(t, rotated, "order")
	for _, id := range ids {
		tok := after.Encode(id)
		if tok[0] != alphabet[newID] || tok == oldTokens[id] {
			t.Fatalf("token of %d after rotation: %q; want key id %q and not the old token %q", id, tok, alphabet[newID], oldTokens[id])
		}
		for name, c := range map[string]*publicid.Codec{"rotated": after, "staged": during} {
			if got, err := c.Decode(oldTokens[id]); err != nil || got != id {
				t.Fatalf("%s key set: old token of %d decodes to %d, %v", name, id, got, err)
			}
			if got, err := c.Decode(tok); err != nil || got != id {
				t.Fatalf("%s key set: new token of %d decodes to %d, %v", name, id, got, err)
			}
		}
		// A staged key decodes but does not encode yet: same tokens as before.
		if got := during.Encode(id); got != oldTokens[id] {
			t.Fatalf("staged key set encodes %d as %q, want the old %q", id, got, oldTokens[id])
		}
		// Where the new key has not arrived, its tokens name an unknown key.
		if _, err := before.Decode(tok); !errors.Is(err, publicid.ErrUnknownKey) {
			t.Fatalf("old key set decoding a new token: %v, want ErrUnknownKey", err)
		}
	}

	// Retire the old key: drop its line from the key file.
	var kept []string
	for line := range strings.Lines(string(rotated.KeyFile())) {
		if !strings.HasPrefix(line, "key 0 ") {
			kept = append(kept, line)
		}
	}
	retired, err := publicid.ParseKeyFile([]byte(strings.Join(kept, "")))
	if err != nil {
		t.Fatal(err)
	}
	final := testCodec(t, retired, "order")
	for _, id := range ids {
		if _, err := final.Decode(oldTokens[id]); !errors.Is(err, publicid.ErrUnknownKey) {
			t.Fatalf("a retired key's token: %v, want ErrUnknownKey", err)
		}
		if got, err := final.Decode(after.Encode(id)); err != nil || got != id {
			t.Fatalf("after retiring the old key: %d, %v", got, err)
		}
	}
}

func TestNewCodecRefusesBadKinds(t *testing.T) {
	ks := testKeys(t, "kind", 0, 0)
	for _, k := range []string{"", strings.Repeat("k", publicid.MaxKindLen+1), "or der", "order/1", "ordré", "order\x00", "a:b"} {
		if c, err := publicid.NewCodec(ks, k); !errors.Is(err, publicid.ErrInvalidKind) || c != nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("NewCodec(%q): %v, %v; want ErrInvalidKind", k, c, err)
		}
	}
	if c, err := publicid.NewCodec(nil, "order"); !errors.Is(err, publicid.ErrInvalidKeys) || c != nil {
		t.Errorf("NewCodec(nil): %v, %v; want ErrInvalidKeys", c, err)
	}
	if c, err := publicid.NewCodec(&publicid.KeySet{}, "order"); !errors.Is(err, publicid.ErrInvalidKeys) || c != nil {
		t.Errorf("NewCodec(empty KeySet): %v, %v; want ErrInvalidKeys", c, err)
	}
}

// Decode allocates nothing, not even to refuse a forgery, and Encode only
// its result (the acceptance's
// "no allocation on decode beyond the result"). AllocsPerRun counts whole
// allocations per run: under the race detector sync.Pool drops a quarter
// of the buffers put back, which costs a quarter of an allocation a call on
// average and so still counts 0 (Decode) and 1 (Encode).
func TestAllocations(t *testing.T) {
	c := testCodec(t, testKeys(t, "alloc", 0, 0), "order")
	tok := c.Encode(12345)
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.Decode(tok) }); n != 0 {
		t.Errorf("Decode: %.1f allocations, want 0", n)
	}
	forged := tok[:5] + "x" + tok[6:]
	if n := testing.AllocsPerRun(1000, func() { _, _ = c.Decode(forged) }); n != 0 {
		t.Errorf("Decode of a forged token: %.1f allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = c.Encode(12345) }); n != 1 {
		t.Errorf("Encode: %.1f allocations, want 1 (the token)", n)
	}
}
