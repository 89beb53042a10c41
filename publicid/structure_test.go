package publicid_test

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/idrange/idrange/snowflake"
)

// The statistical bounds of structureProblems, for n tokens of a keyed
// pseudorandom permutation (every bit of the block an independent fair
// coin, as far as anyone without the key can tell):
//
//   - the ones at one bit position, and the flips of one bit position
//     between consecutive tokens, are Binomial(n, 1/2): within
//     sigmas*sqrt(n)/2 of n/2;
//   - the consecutive pairs whose first block character agrees are
//     Binomial(n-1, 1/64): within sigmas standard deviations of (n-1)/64;
//   - no two consecutive tokens share more than maxShared block characters
//     at the front: for one pair that has probability 64^-(maxShared+1).
//
// With sigmas = 6 a true pseudorandom permutation fails one bit position
// with probability 2*Phi(-6) = 2.0e-9, so all 2 x 128 positions and the
// prefix count with about 5e-7; maxShared = 5 fails 100,000 pairs with
// probability 1e5 * 64^-6 = 1.5e-6. The keys are fixed, so the test is
// deterministic: it cannot flake, and these are the odds that a sound
// construction with these keys would have been refused. A counter or a
// transparent encoding fails by hundreds of sigmas
// (TestStructureCheckCatchesStructure).
const (
	sigmas    = 6
	maxShared = 5
)

// structureProblems lists what tokens (made in the order of consecutive
// IDs, all with key id keyChar) show beyond their key id; nil when nothing.
func structureProblems(tokens []string, keyChar byte) []string {
	n := len(tokens)
	var problems []string
	blocks := make([][16]byte, n)
	for i, tok := range tokens {
		if tok[0] != keyChar {
			return []string{fmt.Sprintf("token %d starts with %q, not the key id %q", i, tok[0], keyChar)}
		}
		b, err := base64.RawURLEncoding.DecodeString(tok[1:])
		if err != nil || len(b) != 16 {
			return []string{fmt.Sprintf("token %d: block %q is not 16 bytes of base64url: %v", i, tok[1:], err)}
		}
		copy(blocks[i][:], b)
	}

	// No common prefix beyond the key id: the first block character takes
	// every value (there are 64; n/64 of each are expected).
	seen := map[byte]bool{}
	for _, tok := range tokens {
		seen[tok[1]] = true
	}
	if len(seen) < 64 {
		problems = append(problems, fmt.Sprintf("the first block character takes %d of 64 values", len(seen)))
	}

	// Bit balance and bit flips between neighbours, per position.
	half, bound := float64(n)/2, sigmas*math.Sqrt(float64(n))/2
	for bit := range 128 {
		ones, flips := 0, 0
		for i := range blocks {
			v := blocks[i][bit/8] >> (7 - bit%8) & 1
			ones += int(v)
			if i > 0 && v != blocks[i-1][bit/8]>>(7-bit%8)&1 {
				flips++
			}
		}
		if d := math.Abs(float64(ones) - half); d > bound {
			problems = append(problems, fmt.Sprintf("bit %d is 1 in %d of %d tokens: %.0f from n/2, bound %.0f", bit, ones, n, d, bound))
		}
		if d := math.Abs(float64(flips) - (half - 0.5)); d > bound {
			problems = append(problems, fmt.Sprintf("bit %d flips between %d of %d neighbours: %.0f from (n-1)/2, bound %.0f", bit, flips, n-1, d, bound))
		}
	}

	// Neighbours share a prefix beyond the key id no more than chance does.
	same, longest, at := 0, 0, 0
	for i := 1; i < n; i++ {
		k := 1
		for k < len(tokens[i]) && tokens[i][k] == tokens[i-1][k] {
			k++
		}
		if k-1 > 0 {
			same++
		}
		if k-1 > longest {
			longest, at = k-1, i
		}
	}
	p := 1.0 / 64
	mean, sd := float64(n-1)*p, math.Sqrt(float64(n-1)*p*(1-p))
	if d := math.Abs(float64(same) - mean); d > sigmas*sd {
		problems = append(problems, fmt.Sprintf("%d of %d neighbours share their first block character: %.0f from %.0f, bound %.0f", same, n-1, d, mean, sigmas*sd))
	}
	if longest > maxShared {
		problems = append(problems, fmt.Sprintf("tokens %d and %d share %d characters after the key id (bound %d)", at-1, at, longest, maxShared))
	}

	distinct := map[string]bool{}
	for _, tok := range tokens {
		distinct[tok] = true
	}
	if len(distinct) != n {
		problems = append(problems, fmt.Sprintf("%d tokens for %d IDs", len(distinct), n))
	}
	return problems
}

// consecutiveIDs are n consecutive IDs from a realistic one (minted at
// 2027-03-01 by region 2, worker 17): they cross sequence and worker
// boundaries, so every low field of the layout changes.
func consecutiveIDs(t testing.TB, n int) []int64 {
	first, err := snowflake.Compose(snowflake.MsSince(snowflake.Epoch.AddDate(1, 2, 0)), 2, 17, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(first) + int64(i)
	}
	return ids
}

// The acceptance: tokens of 100k consecutive IDs share no structure beyond
// the key id (structureProblems states the bounds and why).
func TestConsecutiveIDsShareNoStructure(t *testing.T) {
	const keyID = 9
	c := testCodec(t, testKeys(t, "structure", keyID, keyID), "order")
	ids := consecutiveIDs(t, 100_000)
	tokens := make([]string, len(ids))
	for i, id := range ids {
		tokens[i] = c.Encode(id)
	}
	for _, p := range structureProblems(tokens, alphabet[keyID]) {
		t.Error(p)
	}
}

// The check above can fail: it refuses encodings that show their ID.
func TestStructureCheckCatchesStructure(t *testing.T) {
	ids := consecutiveIDs(t, 100_000)
	for name, enc := range map[string]func(int64) [16]byte{
		// The ID in clear, then a constant.
		"transparent": func(id int64) (b [16]byte) {
			binary.BigEndian.PutUint64(b[:8], uint64(id))
			return b
		},
		// The ID XORed with a secret-looking constant, twice over.
		"xor": func(id int64) (b [16]byte) {
			binary.BigEndian.PutUint64(b[:8], uint64(id)^0x9e3779b97f4a7c15)
			binary.BigEndian.PutUint64(b[8:], uint64(id)^0xc2b2ae3d27d4eb4f)
			return b
		},
		// A multiplicative hash: the high bits look random, neighbours do not.
		"multiply": func(id int64) (b [16]byte) {
			binary.BigEndian.PutUint64(b[:8], uint64(id)*0x9e3779b97f4a7c15)
			binary.BigEndian.PutUint64(b[8:], uint64(id)*0xff51afd7ed558ccd)
			return b
		},
	} {
		tokens := make([]string, len(ids))
		for i, id := range ids {
			b := enc(id)
			tokens[i] = "A" + base64.RawURLEncoding.EncodeToString(b[:])
		}
		problems := structureProblems(tokens, 'A')
		if len(problems) == 0 {
			t.Errorf("%s encoding: no problem found", name)
			continue
		}
		t.Logf("%s encoding: %d problems, first: %s", name, len(problems), problems[0])
	}
}
