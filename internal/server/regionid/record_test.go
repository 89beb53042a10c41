package regionid

import (
	"errors"
	"strings"
	"testing"
)

func validRecord() Record {
	return Record{Version: 1, Region: 1, RegionID: strings.Repeat("ab", 16), CreatedUnixMs: 1_780_000_000_000,
		Layout: 1, EtcdClusterID: "cdf818194e3a8c32"}
}

func TestRecordRoundTrip(t *testing.T) {
	r := validRecord()
	r.RestorePending, r.RestoreReason, r.RestoreSinceUnixMs = true, "a replica started with --restored", 5
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"v":1,"region":1,"region_id":"abababababababababababababababab","created_unix_ms":1780000000000,"layout":1,"etcd_cluster_id":"cdf818194e3a8c32","registry_claimed_unix_ms":0,"registry_cluster_id":"","restore_pending":true,"restore_reason":"a replica started with --restored","restore_since_unix_ms":5,"fenced_unix_ms":0,"fenced_to_unix_ms":0}`
	if string(b) != want {
		t.Fatalf("encoded\n%s\nwant\n%s", b, want)
	}
	got, err := Decode(b)
	if err != nil || got != r {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
}

// Anything but exactly what Encode writes is corrupt: never a default.
func TestDecodeCorrupt(t *testing.T) {
	good, _ := validRecord().Encode()
	g := string(good)
	for name, v := range map[string]string{
		"empty":              "",
		"not json":           "region 1",
		"trailing":           g + "{}",
		"unknown field":      strings.Replace(g, `{"v":1,`, `{"v":1,"x":2,`, 1),
		"missing field":      strings.Replace(g, `"layout":1,`, ``, 1),
		"spacing":            strings.Replace(g, `"region":1`, `"region": 1`, 1),
		"version 2":          strings.Replace(g, `{"v":1`, `{"v":2`, 1),
		"region 4":           strings.Replace(g, `"region":1`, `"region":4`, 1),
		"region -1":          strings.Replace(g, `"region":1`, `"region":-1`, 1),
		"region string":      strings.Replace(g, `"region":1`, `"region":"1"`, 1),
		"short id":           strings.Replace(g, `abababababababababababababababab`, `abab`, 1),
		"upper id":           strings.Replace(g, `abababababababababababababababab`, `ABABABABABABABABABABABABABABABAB`, 1),
		"no created":         strings.Replace(g, `1780000000000`, `0`, 1),
		"layout 0":           strings.Replace(g, `"layout":1`, `"layout":0`, 1),
		"cluster":            strings.Replace(g, `cdf818194e3a8c32`, `xyz`, 1),
		"claim no id":        strings.Replace(g, `"registry_claimed_unix_ms":0`, `"registry_claimed_unix_ms":7`, 1),
		"pending no why":     strings.Replace(g, `"restore_pending":false`, `"restore_pending":true`, 1),
		"reason not pending": strings.Replace(g, `"restore_reason":""`, `"restore_reason":"x"`, 1),
		"fenced half":        strings.Replace(g, `"fenced_unix_ms":0`, `"fenced_unix_ms":3`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(v))
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode(%q) = %v, want ErrCorrupt", v, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestMatchNamesBothCodes(t *testing.T) {
	err := validRecord().Match(2)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "holds region 1") || !strings.Contains(err.Error(), "--region 2") {
		t.Fatalf("Match(2) = %v", err)
	}
	r := validRecord()
	r.Layout = 2
	if err := r.Match(1); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "layout version 2") {
		t.Fatalf("layout mismatch: %v", err)
	}
	if err := validRecord().Match(1); err != nil {
		t.Fatal(err)
	}
}

func TestClaimValue(t *testing.T) {
	id := strings.Repeat("0f", 16)
	if got, err := DecodeClaim([]byte(EncodeClaim(id))); err != nil || got != id {
		t.Fatalf("DecodeClaim = %q, %v", got, err)
	}
	for _, v := range []string{"", id, "v1:" + id[:30], "v2:" + id, "v1:" + strings.ToUpper(id), "v1:" + id + " "} {
		if _, err := DecodeClaim([]byte(v)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeClaim(%q) = %v, want ErrCorrupt", v, err)
		}
	}
}

func TestParseRegionKey(t *testing.T) {
	p := "/idrange/v1/"
	for key, want := range map[string]int{p + "r1/hwm/001": 1, p + "r3/lease/200": 3} {
		if r, ok := parseRegionKey(key, p); !ok || r != want {
			t.Errorf("parseRegionKey(%q) = %d, %v", key, r, ok)
		}
	}
	for _, key := range []string{p + "region", p + "compactor", p + "rx/hwm/001", p + "r1"} {
		if _, ok := parseRegionKey(key, p); ok {
			t.Errorf("parseRegionKey(%q) ok", key)
		}
	}
}

// FuzzDecode: a stored region record or registry claim either decodes to a
// value whose encoding is exactly the bytes read, or fails with ErrCorrupt
// on one line; nothing in between is read as a default.
func FuzzDecode(f *testing.F) {
	good, _ := validRecord().Encode()
	r := validRecord()
	r.RestorePending, r.RestoreReason, r.RestoreSinceUnixMs = true, "restored", 5
	r.RegistryClaimedUnixMs, r.RegistryClusterID = 7, "00000000000000ff"
	r.FencedUnixMs, r.FencedToUnixMs = 8, 9
	pending, _ := r.Encode()
	for _, b := range [][]byte{good, pending, []byte(""), []byte("{}"), []byte("null"), append(good, ' '),
		[]byte(strings.Replace(string(good), `"v":1`, `"v":1.0`, 1)), []byte(EncodeClaim(strings.Repeat("0f", 16))), []byte("v1:")} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("Decode(%q): %q, want one line wrapping ErrCorrupt", b, err)
			}
		} else if again, eerr := rec.Encode(); eerr != nil || string(again) != string(b) {
			t.Fatalf("Decode(%q) = %+v, which encodes to %q, %v", b, rec, again, eerr)
		}
		id, err := DecodeClaim(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("DecodeClaim(%q): %q, want one line wrapping ErrCorrupt", b, err)
			}
		} else if EncodeClaim(id) != string(b) {
			t.Fatalf("DecodeClaim(%q) = %q, which encodes to %q", b, id, EncodeClaim(id))
		}
	})
}
