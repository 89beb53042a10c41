package store_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

func TestHighWaterEncoding(t *testing.T) {
	for _, v := range []int64{0, 1, 4096, 123456789, segment.EndL} {
		s := store.EncodeHighWater(v)
		got, err := store.DecodeHighWater([]byte(s))
		if err != nil || got != v {
			t.Errorf("round trip %d -> %q -> %d, %v", v, s, got, err)
		}
	}
	bad := []string{
		"", "0", "1", "v1:", "v1:-1", "v1:+1", "v1:01", "v1:00", " v1:1", "v1:1 ", "v1: 1", "v1:1\n",
		"v2:1", "V1:1", "v1:0x10", "v1:1e3", "v1:1.0", "v1:9223372036854775807", "v1:99999999999999999999",
		"v1:" + strconv.FormatInt(segment.EndL+1, 10), "v1:１", "v1:1\x00", "null", `{"v":1}`,
	}
	for _, s := range bad {
		if v, err := store.DecodeHighWater([]byte(s)); !errors.Is(err, segment.ErrCorrupt) {
			t.Errorf("DecodeHighWater(%q) = %d, %v; want segment.ErrCorrupt", s, v, err)
		}
	}
}

// FuzzDecodeHighWater: whatever the bytes, a value is accepted only if it is
// exactly the canonical encoding of an in-range mark; everything else is
// ErrCorrupt (never 0 by default).
func FuzzDecodeHighWater(f *testing.F) {
	for _, s := range []string{"v1:0", "v1:42", "v1:", "v1:-0", "v1:007", "garbage", "v1:9223372036854775808"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := store.DecodeHighWater(b)
		if err != nil {
			if !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("%q: error %v does not wrap segment.ErrCorrupt", b, err)
			}
			if v != 0 {
				t.Fatalf("%q: error with value %d", b, v)
			}
			return
		}
		if v < 0 || v > segment.EndL {
			t.Fatalf("%q decoded to out-of-range %d", b, v)
		}
		if store.EncodeHighWater(v) != string(b) {
			t.Fatalf("%q decoded to %d, which encodes differently", b, v)
		}
	})
}

func validRecord() store.OwnerRecord {
	return store.OwnerRecord{Version: 1, Region: 3, Worker: 255, LeaseID: 0x7a3b, Owner: "host-a/123 <x&y>", AcquiredUnixMs: 1767225600000}
}

func TestOwnerRecordEncoding(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200; i++ {
		rec := store.OwnerRecord{
			Version: 1, Region: r.IntN(4), Worker: r.IntN(256), LeaseID: 1 + r.Int64N(1<<62),
			Owner: "pod-" + strconv.Itoa(r.IntN(1e6)) + "/é", AcquiredUnixMs: 1 + r.Int64N(1<<45),
		}
		got, err := store.DecodeOwnerRecord([]byte(rec.Encode()))
		if err != nil || got != rec {
			t.Fatalf("round trip %+v -> %q -> %+v, %v", rec, rec.Encode(), got, err)
		}
	}
	good := validRecord().Encode()
	mutate := func(f func(*store.OwnerRecord)) string {
		rec := validRecord()
		f(&rec)
		return rec.Encode()
	}
	bad := []string{
		"", "null", "{}", "v1:5", good + " ", " " + good, good + "{}",
		`{"v":1,"region":3,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000,"extra":1}`,
		`{"V":1,"region":3,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000}`,
		`{"v":1,"v":1,"region":3,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000}`,
		`{"region":3,"v":1,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000}`,
		`{"v":1.0,"region":3,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000}`,
		mutate(func(r *store.OwnerRecord) { r.Version = 2 }),
		mutate(func(r *store.OwnerRecord) { r.Region = 4 }),
		mutate(func(r *store.OwnerRecord) { r.Worker = 256 }),
		mutate(func(r *store.OwnerRecord) { r.Worker = -1 }),
		mutate(func(r *store.OwnerRecord) { r.LeaseID = 0 }),
		mutate(func(r *store.OwnerRecord) { r.AcquiredUnixMs = 0 }),
		mutate(func(r *store.OwnerRecord) { r.Owner = "tab\there" }),
		mutate(func(r *store.OwnerRecord) { r.Owner = string(make([]byte, 300)) }),
		mutate(func(r *store.OwnerRecord) { r.Identity = "cn:a" }),                   // version 1 with an identity
		mutate(func(r *store.OwnerRecord) { r.Version = 2; r.Identity = "cn:\x00" }), // non-printable identity
		mutate(func(r *store.OwnerRecord) { r.Version = 3; r.Identity = "cn:a" }),
		`{"v":2,"region":3,"worker":255,"lease_id":31291,"owner":"x","identity":"","acquired_unix_ms":1767225600000}`,
		`{"v":2,"region":3,"worker":255,"lease_id":31291,"owner":"x","acquired_unix_ms":1767225600000,"identity":"cn:a"}`,
	}
	for _, s := range bad {
		if rec, err := store.DecodeOwnerRecord([]byte(s)); !errors.Is(err, segment.ErrCorrupt) {
			t.Errorf("DecodeOwnerRecord(%q) = %+v, %v; want segment.ErrCorrupt", s, rec, err)
		}
	}
}

// FuzzDecodeOwnerRecord: a record decodes only from its exact canonical
// bytes, with every field in range.
func FuzzDecodeOwnerRecord(f *testing.F) {
	f.Add([]byte(validRecord().Encode()))
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`garbage`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := store.DecodeOwnerRecord(b)
		if err != nil {
			if !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("%q: error %v does not wrap segment.ErrCorrupt", b, err)
			}
			return
		}
		if rec.Encode() != string(b) {
			t.Fatalf("%q decoded to %+v, which encodes differently", b, rec)
		}
		if rec.Version != 1 && rec.Version != 2 || rec.Region < 0 || rec.Region > 3 || rec.Worker < 0 || rec.Worker > 255 || rec.LeaseID == 0 {
			t.Fatalf("%q decoded to out-of-range %+v", b, rec)
		}
	})
}

// A record without an identity is the version 1 form, byte for byte; one
// with an identity is version 2 and round-trips.
func TestOwnerRecordIdentityVersions(t *testing.T) {
	v1 := validRecord()
	want := `{"v":1,"region":3,"worker":255,"lease_id":31291,"owner":"host-a/123 \u003cx\u0026y\u003e","acquired_unix_ms":1767225600000}`
	if got := v1.Encode(); got != want {
		t.Fatalf("version 1 record encodes as %s, want %s", got, want)
	}
	v2 := validRecord()
	v2.Version, v2.Identity = 2, "uri:spiffe://idrange.test/minter/a"
	got, err := store.DecodeOwnerRecord([]byte(v2.Encode()))
	if err != nil || got != v2 {
		t.Fatalf("version 2 round trip %+v -> %s -> %+v, %v", v2, v2.Encode(), got, err)
	}
}
