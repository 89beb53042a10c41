package benchrun

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// CPU samples are summed by their role label, unlabelled ones as "other",
// in cores over the profile's duration; a profile without CPU samples is
// an error, not zeros.
func TestCPUByRole(t *testing.T) {
	ms := int64(time.Millisecond)
	sample := func(cpu int64, role string) *profile.Sample {
		s := &profile.Sample{Value: []int64{1, cpu}}
		if role != "" {
			s.Label = map[string][]string{"role": {role}}
		}
		return s
	}
	prof := &profile.Profile{
		SampleType:    []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		DurationNanos: int64(2 * time.Second),
		Sample: []*profile.Sample{
			sample(1000*ms, "replica"), sample(500*ms, "replica"),
			sample(2000*ms, "pacer"), sample(100*ms, ""),
		},
	}
	// Through the encoding the runtime writes, as stop reads it.
	var buf bytes.Buffer
	if err := prof.Write(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cpuByRole(back)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"replica": 0.75, "pacer": 1, "other": 0.05}
	for role, w := range want {
		if math.Abs(got[role]-w) > 1e-9 {
			t.Errorf("%s: %v cores, want %v (all: %v)", role, got[role], w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("roles %v, want %v", got, want)
	}
	if _, err := cpuByRole(&profile.Profile{SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}}, DurationNanos: 1}); err == nil {
		t.Error("a profile without cpu samples: no error")
	}
}
