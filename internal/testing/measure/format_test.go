package measure

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestDurJSONRoundTrip(t *testing.T) {
	in := struct {
		D Dur `json:"d"`
	}{Dur(1500 * time.Millisecond)}
	b, err := json.Marshal(in)
	if err != nil || string(b) != `{"d":"1.5s"}` {
		t.Fatalf("Marshal = %s, %v; want {\"d\":\"1.5s\"}", b, err)
	}
	var out struct {
		D Dur `json:"d"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.D != in.D {
		t.Fatalf("Unmarshal = %v, %v; want %v", time.Duration(out.D), err, time.Duration(in.D))
	}
	if err := json.Unmarshal([]byte(`{"d":"soon"}`), &out); err == nil {
		t.Fatal("a malformed duration was accepted")
	}
}

func TestLatency(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0ns",
		850:                     "850ns",
		12345:                   "12.3µs",
		1_049_000:               "1.05ms",
		999_400_000:             "999ms",
		2500 * time.Millisecond: "2.5s",
	} {
		if got := Latency(d); got != want {
			t.Errorf("Latency(%d) = %q, want %q", d, got, want)
		}
	}
}

func TestSI(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 999: "999", 1000: "1.0k", 4096: "4.1k", 999_949: "999.9k", 1e6: "1.00M", 2_048_000: "2.05M",
	} {
		if got := SI(v); got != want {
			t.Errorf("SI(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestWriteJSONIndents(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"a\": 1\n}\n"; b.String() != want {
		t.Fatalf("WriteJSON = %q, want %q", b.String(), want)
	}
}
