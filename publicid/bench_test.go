package publicid_test

import (
	"errors"
	"testing"

	"github.com/idrange/idrange/publicid"
)

// The acceptance wants Encode and Decode under 1 µs each; scripts/figures
// --only token runs these next to snowflake's BenchmarkParse and
// BenchmarkDecode (docs/figures/token.md).

func benchCodec(b *testing.B) *publicid.Codec {
	return testCodec(b, testKeys(b, "bench", 1, 0, 1), "order")
}

// benchIDs are IDs of one region's minute, in a ring so successive calls
// see different IDs (and tokens).
func benchIDs(b *testing.B) []int64 { return consecutiveIDs(b, 1024) }

func BenchmarkEncode(b *testing.B) {
	c, ids := benchCodec(b), benchIDs(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_ = c.Encode(ids[i&1023])
		i++
	}
}

func BenchmarkDecode(b *testing.B) {
	c, ids := benchCodec(b), benchIDs(b)
	tokens := make([]string, len(ids))
	for i, id := range ids {
		tokens[i] = c.Encode(id)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Decode(tokens[i&1023]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkDecodeParallel is Decode from every core at once on one Codec.
func BenchmarkDecodeParallel(b *testing.B) {
	c := benchCodec(b)
	tok := c.Encode(153652455016566789)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Decode(tok); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDecodeForged is the cost of refusing a forged token.
func BenchmarkDecodeForged(b *testing.B) {
	c := benchCodec(b)
	tok := c.Encode(153652455016566789)
	forged := tok[:5] + "x" + tok[6:]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Decode(forged); !errors.Is(err, publicid.ErrNotAuthentic) {
			b.Fatal(err)
		}
	}
}
