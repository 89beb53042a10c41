package segment_test

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

const ms = segment.PerMs // L units per millisecond

func TestPlanRule(t *testing.T) {
	p := segment.DefaultPolicy()
	lead := p.MaxLead.Milliseconds()
	const now = int64(1_000_000) // ms since epoch
	cases := []struct {
		name     string
		hwm, n   int64
		nowMs    int64
		lo, hi   int64
		retryMs  int64 // > 0: want *Backpressure with this RetryAfter
		sentinel error // want this error
	}{
		{name: "fresh code starts at now", hwm: 0, n: 4096, nowMs: now, lo: now * ms, hi: now*ms + 4096},
		{name: "hwm behind now: now wins", hwm: now*ms - 7, n: 10, nowMs: now, lo: now * ms, hi: now*ms + 10},
		{name: "hwm ahead of now: hwm wins", hwm: now*ms + 123, n: 10, nowMs: now, lo: now*ms + 123, hi: now*ms + 133},
		{name: "clock 2 s behind hwm still grants at hwm", hwm: (now + 2000) * ms, n: 4_096_000, nowMs: now,
			lo: (now + 2000) * ms, hi: (now+2000)*ms + 4_096_000},
		{name: "shrunk to the lead", hwm: (now + lead - 8) * ms, n: 10 * ms, nowMs: now,
			lo: (now + lead - 8) * ms, hi: (now + lead) * ms},
		{name: "shrunk to exactly the least share (75%)", hwm: (now+lead)*ms - 3*ms, n: 4 * ms, nowMs: now,
			lo: (now+lead)*ms - 3*ms, hi: (now + lead) * ms},
		{name: "one unit short of the least share: backpressure until it fits", hwm: (now+lead)*ms - 3*ms + 1, n: 4 * ms, nowMs: now,
			retryMs: 1},
		{name: "trimmed to 10% of the request: backpressure until 75% fits", hwm: (now + lead - 1) * ms, n: 10 * ms, nowMs: now,
			retryMs: 7},
		{name: "storm case: 1 s asked, 2 ms free: wait 748 ms", hwm: (now + lead - 2) * ms, n: 1000 * ms, nowMs: now,
			retryMs: 748},
		{name: "a small request that fits is granted whole", hwm: (now+lead)*ms - 5, n: 5, nowMs: now, lo: (now+lead)*ms - 5, hi: (now + lead) * ms},
		{name: "one unit below the lead, 5 asked: 4 needed", hwm: (now+lead)*ms - 1, n: 5, nowMs: now, retryMs: 1},
		{name: "one unit below the lead, 1 asked", hwm: (now+lead)*ms - 1, n: 1, nowMs: now, lo: (now+lead)*ms - 1, hi: (now + lead) * ms},
		{name: "request larger than the lead: the least share is capped at the lead", hwm: 0, n: p.MaxBlock, nowMs: now,
			lo: now * ms, hi: now*ms + p.MaxBlock},
		{name: "at the lead: backpressure 1 ms", hwm: (now + lead) * ms, n: 1, nowMs: now, retryMs: 1},
		{name: "past the lead: backpressure", hwm: (now+lead+1000)*ms + 5, n: 1, nowMs: now, retryMs: 1001},
		{name: "max block accepted", hwm: 0, n: p.MaxBlock, nowMs: now, lo: now * ms, hi: now*ms + p.MaxBlock},
		{name: "count 0", n: 0, nowMs: now, sentinel: segment.ErrInvalid},
		{name: "count negative", n: -1, nowMs: now, sentinel: segment.ErrInvalid},
		{name: "count over max block", n: p.MaxBlock + 1, nowMs: now, sentinel: segment.ErrInvalid},
		{name: "negative hwm", hwm: -1, n: 1, nowMs: now, sentinel: segment.ErrInvalid},
		{name: "hwm past the epoch end", hwm: segment.EndL + 1, n: 1, nowMs: now, sentinel: segment.ErrInvalid},
		{name: "last millisecond usable, block shrunk to the end", hwm: 0, n: 3 * ms, nowMs: snowflake.MaxTimestamp,
			lo: snowflake.MaxTimestamp * ms, hi: segment.EndL},
		{name: "the ms after the last is rejected", n: 1, nowMs: snowflake.MaxTimestamp + 1, sentinel: segment.ErrEpochExhausted},
		{name: "hwm at the epoch end", hwm: segment.EndL, n: 1, nowMs: now, sentinel: segment.ErrEpochExhausted},
		{name: "clock before the epoch never yields L 0", hwm: 0, n: 10, nowMs: -5, lo: 1, hi: 11},
		{name: "absurd clock far before the epoch: backpressure", hwm: 0, n: 10, nowMs: -1 << 60,
			retryMs: snowflake.MaxTimestamp + 1 - lead},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lo, hi, err := p.PlanMs(c.hwm, c.nowMs, c.n)
			switch {
			case c.retryMs > 0:
				var bp *segment.Backpressure
				if !errors.As(err, &bp) || !errors.Is(err, segment.ErrBackpressure) {
					t.Fatalf("err = %v, want *Backpressure", err)
				}
				if want := time.Duration(c.retryMs) * time.Millisecond; bp.RetryAfter != want {
					t.Fatalf("RetryAfter = %v, want %v", bp.RetryAfter, want)
				}
			case c.sentinel != nil:
				if !errors.Is(err, c.sentinel) {
					t.Fatalf("err = %v, want %v", err, c.sentinel)
				}
			case err != nil:
				t.Fatalf("err = %v", err)
			case lo != c.lo || hi != c.hi:
				t.Fatalf("got [%d,%d), want [%d,%d)", lo, hi, c.lo, c.hi)
			}
		})
	}
}

func TestPlanInvalidCountNamesField(t *testing.T) {
	_, _, err := segment.DefaultPolicy().PlanMs(0, 1000, 0)
	if err == nil || !strings.Contains(err.Error(), "count") {
		t.Fatalf("err = %v, want it to name count", err)
	}
}

func TestPlanTimes(t *testing.T) {
	now := snowflake.MsTime(5000).Add(300 * time.Microsecond)
	g, err := segment.DefaultPolicy().Plan(0, now, 10*ms+1)
	if err != nil {
		t.Fatal(err)
	}
	if !g.ServiceTime.Equal(now) {
		t.Fatalf("ServiceTime %v, want %v", g.ServiceTime, now)
	}
	// Hi-1 = 5010 ms, seq 0: valid until the start of ms 5011.
	if want := snowflake.MsTime(5011); !g.ValidUntil.Equal(want) {
		t.Fatalf("ValidUntil %v, want %v", g.ValidUntil, want)
	}
	if got := segment.ValidUntil(5000*ms + ms); !got.Equal(snowflake.MsTime(5001)) {
		t.Fatalf("ValidUntil of a block ending on a ms boundary = %v", got)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := segment.DefaultPolicy().Validate(); err != nil {
		t.Fatalf("default policy: %v", err)
	}
	if (segment.Policy{}).WithDefaults() != segment.DefaultPolicy() {
		t.Fatal("zero policy does not default to DefaultPolicy")
	}
	bad := map[string]segment.Policy{
		"MaxBlock":        {MaxBlock: 0, MaxLead: time.Second},
		"MaxLead":         {MaxBlock: 1, MaxLead: 0},
		"MinGrantPercent": {MaxBlock: 1, MaxLead: time.Second, MinGrantPercent: 101},
	}
	bad["MinGrantPercent "] = segment.Policy{MaxBlock: 1, MaxLead: time.Second, MinGrantPercent: -1}
	bad["MaxLead "] = segment.Policy{MaxBlock: 1, MaxLead: 1500 * time.Microsecond}
	bad["MaxBlock "] = segment.Policy{MaxBlock: segment.MaxBlockLimit + 1, MaxLead: time.Second}
	for field, p := range bad {
		err := p.Validate()
		if !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("%+v: Validate() = %v, want ErrInvalid naming %s", p, err, field)
		}
	}
}

// checkPlans runs a sequence of grants on one code, feeding each Hi back as
// the HWM, with the service clock moving by the given steps (any sign), and
// checks the invariants that uniqueness rests on.
func checkPlans(t *testing.T, p segment.Policy, startMs int64, steps []int64, sizes []int64) {
	t.Helper()
	hwm, nowMs := int64(0), startMs
	lead := p.MaxLead.Milliseconds()
	var prevHi int64
	for i := range steps {
		nowMs += steps[i]
		n := sizes[i]
		lo, hi, err := p.PlanMs(hwm, nowMs, n)
		var bp *segment.Backpressure
		switch {
		case err == nil:
			if lo < hwm || lo < prevHi {
				t.Fatalf("step %d: Lo %d below HWM %d / previous Hi %d", i, lo, hwm, prevHi)
			}
			if hi <= lo || hi-lo > n {
				t.Fatalf("step %d: block [%d,%d) for n=%d", i, lo, hi, n)
			}
			if lo < 1 || hi > segment.EndL {
				t.Fatalf("step %d: block [%d,%d) outside 1..EndL", i, lo, hi)
			}
			if nowMs <= snowflake.MaxTimestamp && hi > (nowMs+lead)*ms {
				t.Fatalf("step %d: Hi %d beyond the lead at now %d", i, hi, nowMs)
			}
			least := min((n*int64(p.MinGrantPercent)+99)/100, lead*ms, segment.EndL-lo)
			if hi-lo < least {
				t.Fatalf("step %d: block [%d,%d) is below the least share %d of n=%d", i, lo, hi, least, n)
			}
			if lo != max(hwm, nowMs*ms, 1) {
				t.Fatalf("step %d: Lo %d, want max(hwm %d, now<<12 %d, 1)", i, lo, hwm, nowMs*ms)
			}
			prevHi, hwm = hi, hi
		case errors.As(err, &bp):
			if bp.RetryAfter < time.Millisecond {
				t.Fatalf("step %d: RetryAfter %v", i, bp.RetryAfter)
			}
			// RetryAfter is exact: one ms earlier the same request is still
			// refused, at it it is granted.
			wait := bp.RetryAfter.Milliseconds()
			if _, _, err := p.PlanMs(hwm, nowMs+wait, n); err != nil && !errors.Is(err, segment.ErrEpochExhausted) {
				t.Fatalf("step %d: still refused after RetryAfter %v: %v", i, bp.RetryAfter, err)
			}
			if _, _, err := p.PlanMs(hwm, nowMs+wait-1, n); !errors.Is(err, segment.ErrBackpressure) {
				t.Fatalf("step %d: RetryAfter %v not minimal: %v", i, bp.RetryAfter, err)
			}
		case errors.Is(err, segment.ErrEpochExhausted):
			if hwm < segment.EndL && nowMs <= snowflake.MaxTimestamp && max(hwm, nowMs*ms) < segment.EndL {
				t.Fatalf("step %d: ErrEpochExhausted with hwm %d now %d", i, hwm, nowMs)
			}
		default:
			t.Fatalf("step %d: unexpected error %v (n=%d)", i, err, n)
		}
	}
}

// TestPlanProperty drives checkPlans with random clocks (jumps either way,
// including far back), random sizes and small leads so that shrinking and
// backpressure happen often.
func TestPlanProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 2000; iter++ {
		p := segment.Policy{MaxBlock: 1 + r.Int64N(20*ms), MaxLead: time.Duration(1+r.IntN(20)) * time.Millisecond,
			MinGrantPercent: 1 + r.IntN(100)}
		if iter%4 == 0 {
			p = segment.DefaultPolicy()
		}
		start := r.Int64N(snowflake.MaxTimestamp)
		if iter%10 == 0 {
			start = snowflake.MaxTimestamp - r.Int64N(50) // the end of the epoch
		}
		steps := make([]int64, 50)
		sizes := make([]int64, 50)
		for i := range steps {
			switch r.IntN(4) {
			case 0:
				steps[i] = 0
			case 1:
				steps[i] = r.Int64N(5)
			case 2:
				steps[i] = -r.Int64N(3000) // rollback up to 3 s
			default:
				steps[i] = r.Int64N(40) - 20
			}
			sizes[i] = 1 + r.Int64N(p.MaxBlock)
		}
		checkPlans(t, p, start, steps, sizes)
	}
}

// FuzzPlan lets the fuzzer pick the policy, the starting clock and a
// sequence of clock moves and sizes. Run: go test -fuzz FuzzPlan ./segment
func FuzzPlan(f *testing.F) {
	f.Add(int64(1_000_000), uint32(15_000), uint64(40_960_000), []byte{0, 1, 2, 3, 250, 251, 7})
	f.Add(int64(snowflake.MaxTimestamp-3), uint32(2), uint64(9000), []byte{1, 1, 1, 1, 1, 1})
	f.Add(int64(-5), uint32(1), uint64(1), []byte{128, 0, 255})
	f.Fuzz(func(t *testing.T, start int64, leadMs uint32, maxBlock uint64, prog []byte) {
		p := segment.Policy{
			MaxBlock:        1 + int64(maxBlock%uint64(segment.MaxBlockLimit)),
			MaxLead:         time.Duration(1+leadMs%86_400_000) * time.Millisecond,
			MinGrantPercent: 1 + int(leadMs>>27)%100,
		}
		if start > snowflake.MaxTimestamp+10 || start < -snowflake.MaxTimestamp {
			start %= snowflake.MaxTimestamp
		}
		var steps, sizes []int64
		for i := 0; i+1 < len(prog); i += 2 {
			steps = append(steps, int64(int8(prog[i]))*int64(prog[i+1]%16+1)) // -2048..2032 ms
			sizes = append(sizes, 1+int64(prog[i+1])*p.MaxBlock/256)
		}
		checkPlans(t, p, start, steps, sizes)
	})
}
