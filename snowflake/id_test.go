package snowflake

import (
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestLayoutConstants(t *testing.T) {
	if TimestampBits+RegionBits+WorkerBits+SequenceBits != 63 {
		t.Fatalf("fields use %d bits, want 63 (sign bit stays 0)", TimestampBits+RegionBits+WorkerBits+SequenceBits)
	}
	if life := time.Duration(MaxTimestamp) * time.Millisecond; life < 60*365*24*time.Hour {
		t.Fatalf("epoch life %v is under 60 years", life)
	}
	if MaxSequence+1 < 3000 || MaxWorker+1 < 200 || MaxRegion+1 < 4 {
		t.Fatal("a width is below its requirement (docs/id-layout.md)")
	}
	want := time.Date(2095, time.September, 7, 15, 47, 35, 551e6, time.UTC)
	if got := EndOfLife(); !got.Equal(want) {
		t.Fatalf("EndOfLife = %v, want %v (as documented)", got, want)
	}
}

func TestComposeMax(t *testing.T) {
	id, err := Compose(MaxTimestamp, MaxRegion, MaxWorker, MaxSequence)
	if err != nil {
		t.Fatal(err)
	}
	if id != 1<<63-1 {
		t.Fatalf("all-max fields = %d, want MaxInt64", id)
	}
}

func TestComposeRejects(t *testing.T) {
	for _, tc := range []struct {
		name                string
		ms                  int64
		region, worker, seq int
	}{
		{"negative ms", -1, 0, 0, 1},
		{"ms past max", MaxTimestamp + 1, 0, 0, 0},
		{"region", 1, 4, 0, 0},
		{"negative region", 1, -1, 0, 0},
		{"worker", 1, 0, 256, 0},
		{"seq", 1, 0, 0, 4096},
		{"negative seq", 1, 0, 0, -1},
		{"zero id", 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Compose(tc.ms, tc.region, tc.worker, tc.seq); !errors.Is(err, ErrFieldRange) {
				t.Fatalf("Compose = %v, want ErrFieldRange", err)
			}
		})
	}
}

func TestParse(t *testing.T) {
	id, _ := Compose(123456, 2, 17, 99)
	got, err := Parse(id.String())
	if err != nil || got != id {
		t.Fatalf("Parse(%s) = %d, %v", id, got, err)
	}
	for _, bad := range []string{"", "abc", "0", "-5", "12.5", "9223372036854775808", " 1", "0x10", "+1"} {
		if _, err := Parse(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidID", bad, err)
		}
	}
}

func TestTextAndJSON(t *testing.T) {
	id, _ := Compose(1, 3, 255, 4095)
	b, err := json.Marshal(struct{ ID ID }{id})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"ID":"` + id.String() + `"}`; string(b) != want {
		t.Fatalf("json = %s, want %s", b, want)
	}
	var back struct{ ID ID }
	if err := json.Unmarshal(b, &back); err != nil || back.ID != id {
		t.Fatalf("round trip = %v, %v", back.ID, err)
	}
	if err := json.Unmarshal([]byte(`{"ID":"-3"}`), &back); !errors.Is(err, ErrInvalidID) {
		t.Fatalf("negative id unmarshalled: %v", err)
	}
}

func TestFormat(t *testing.T) {
	id, _ := Compose(1500, 1, 2, 3)
	got := id.Parts().Format(id)
	want := "id=" + id.String() + " time=2026-01-01T00:00:01.5Z region=1 worker=2 seq=3"
	if got != want {
		t.Fatalf("Format = %q, want %q", got, want)
	}
}

func TestRemainingLife(t *testing.T) {
	if RemainingLife(EndOfLife().Add(time.Hour)) != 0 {
		t.Fatal("remaining life after the end must be 0")
	}
	if got := RemainingLife(Epoch); got != time.Duration(MaxTimestamp)*time.Millisecond {
		t.Fatalf("RemainingLife(Epoch) = %v", got)
	}
}

// FuzzComposeDecode: every in-range field tuple round-trips through Compose,
// the accessors and Parse; out-of-range ones are refused. (The linear
// position round trip is segment's FuzzLinear.)
func FuzzComposeDecode(f *testing.F) {
	f.Add(int64(0), 0, 0, 1)
	f.Add(int64(MaxTimestamp), MaxRegion, MaxWorker, MaxSequence)
	f.Add(int64(-1), 5, 300, 5000)
	f.Fuzz(func(t *testing.T, ms int64, region, worker, seq int) {
		id, err := Compose(ms, region, worker, seq)
		inRange := ms >= 0 && ms <= MaxTimestamp && region >= 0 && region <= MaxRegion &&
			worker >= 0 && worker <= MaxWorker && seq >= 0 && seq <= MaxSequence &&
			(ms|int64(region)|int64(worker)|int64(seq)) != 0
		if !inRange {
			if err == nil {
				t.Fatalf("Compose(%d,%d,%d,%d) accepted out-of-range fields", ms, region, worker, seq)
			}
			return
		}
		if err != nil {
			t.Fatalf("Compose(%d,%d,%d,%d): %v", ms, region, worker, seq, err)
		}
		p, err := Decode(id)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ms != ms || p.Region != region || p.Worker != worker || p.Sequence != seq || !p.Time.Equal(MsTime(ms)) {
			t.Fatalf("Decode(%d) = %+v, want ms=%d r=%d w=%d s=%d", id, p, ms, region, worker, seq)
		}
		if back, err := Parse(id.String()); err != nil || back != id {
			t.Fatalf("Parse(String()) = %d, %v", back, err)
		}
	})
}

// FuzzParse: Parse never panics, and what it accepts is positive and prints
// back to the same ID.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"1", "0", "-1", "9223372036854775807", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("Parse(%q) error %v is not ErrInvalidID", s, err)
			}
			return
		}
		if id <= 0 {
			t.Fatalf("Parse(%q) accepted %d", s, id)
		}
		if again, _ := Parse(id.String()); again != id {
			t.Fatal("not stable")
		}
	})
}
