package service

import (
	"testing"
	"time"
)

// The shared path's token bucket: per identity, refilled at the rate up to
// one second of it, refusing with the time until the request fits, and
// giving back what a carve did not use.
func TestSharedLimiter(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newSharedLimiter(1000)
	if _, ok := l.take("a", 600, t0); !ok {
		t.Fatal("first 600 of a 1,000 burst refused")
	}
	wait, ok := l.take("a", 600, t0)
	if ok || wait != 200*time.Millisecond {
		t.Fatalf("600 more at once: ok %v, retry after %v; want refused, 200ms", ok, wait)
	}
	if _, ok := l.take("b", 1000, t0); !ok {
		t.Fatal("another identity is refused by a's use")
	}
	if _, ok := l.take("a", 600, t0.Add(200*time.Millisecond)); !ok {
		t.Fatal("refused after the advertised wait")
	}
	// A carve that used 100 of 600 gives 500 back (and counts client x).
	l.settle("a", "x", 600, 100, t0.Add(200*time.Millisecond))
	if _, ok := l.take("a", 500, t0.Add(200*time.Millisecond)); !ok {
		t.Fatal("unused tokens not given back")
	}
	// The bucket holds one second at most, however long it idles.
	if _, ok := l.take("a", 1001, t0.Add(time.Hour)); ok {
		t.Fatal("more than one second's worth taken at once")
	}
	if _, ok := l.take("a", 1000, t0.Add(time.Hour)); !ok {
		t.Fatal("a full bucket refused its burst")
	}

	// client_ids count for a minute after their last grant; usage is the
	// busiest identity's rate over the bound.
	l2 := newSharedLimiter(1000)
	l2.sweep(t0)
	for i, id := range []string{"x", "y", "z"} {
		at := t0.Add(time.Duration(i) * 20 * time.Second)
		l2.take("a", 100, at)
		l2.settle("a", id, 100, 100, at)
	}
	if n, _ := l2.sweep(t0.Add(40 * time.Second)); n != 3 {
		t.Fatalf("%d clients within the minute, want 3", n)
	}
	if n, _ := l2.sweep(t0.Add(70 * time.Second)); n != 2 {
		t.Fatalf("%d clients after x's minute, want 2", n)
	}
	if l2.clientCount() != 2 {
		t.Fatalf("clientCount %d, want 2", l2.clientCount())
	}
	l3 := newSharedLimiter(1000)
	l3.sweep(t0)
	var usage float64
	for s := 1; s <= 60; s++ {
		at := t0.Add(time.Duration(s) * time.Second)
		l3.take("busy", 900, at)
		l3.settle("busy", "c", 900, 900, at)
		l3.take("idle", 10, at)
		l3.settle("idle", "d", 10, 10, at)
		_, usage = l3.sweep(at)
	}
	if usage < 0.85 || usage > 0.95 {
		t.Fatalf("usage %.3f after a minute at 900 of 1,000 IDs/s, want about 0.9", usage)
	}
}

// Refusals over the rate are logged at most once per sharedLogEvery, each
// line counting the refusals since the one before.
func TestSharedOverRateLogSpacing(t *testing.T) {
	l := newSharedLimiter(1000)
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		at      time.Duration
		refused int
		log     bool
	}{
		{0, 1, true},
		{time.Second, 0, false},
		{30 * time.Second, 0, false},
		{sharedLogEvery, 3, true}, // the two held back and this one
		{sharedLogEvery + time.Second, 0, false},
	}
	for i, s := range steps {
		refused, log := l.overRate(t0.Add(s.at))
		if refused != s.refused || log != s.log {
			t.Fatalf("step %d (at %v): refused %d, log %v; want %d, %v", i, s.at, refused, log, s.refused, s.log)
		}
	}
}
