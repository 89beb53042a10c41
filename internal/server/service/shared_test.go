package service

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// The shared path's token bucket: per identity, refilled at the rate up to
// one second of it, refusing with the time until the request fits, and
// giving back what a carve did not use.
func TestSharedLimiter(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newSharedLimiter(1000, 1e9)
	if _, _, ok := l.take("a", 600, t0, true); !ok {
		t.Fatal("first 600 of a 1,000 burst refused")
	}
	wait, reason, ok := l.take("a", 600, t0, true)
	if ok || wait != 200*time.Millisecond || reason != sharedRateLimited {
		t.Fatalf("600 more at once: ok %v, retry after %v, reason %q; want refused, 200ms, %q", ok, wait, reason, sharedRateLimited)
	}
	if _, _, ok := l.take("b", 1000, t0, true); !ok {
		t.Fatal("another identity is refused by a's use")
	}
	if _, _, ok := l.take("a", 600, t0.Add(200*time.Millisecond), true); !ok {
		t.Fatal("refused after the advertised wait")
	}
	// A carve that used 100 of 600 gives 500 back (and counts client x).
	l.settle("a", "x", 600, 100, t0.Add(200*time.Millisecond), true)
	if _, _, ok := l.take("a", 500, t0.Add(200*time.Millisecond), true); !ok {
		t.Fatal("unused tokens not given back")
	}
	// The bucket holds one second at most, however long it idles.
	if _, _, ok := l.take("a", 1001, t0.Add(time.Hour), true); ok {
		t.Fatal("more than one second's worth taken at once")
	}
	if _, _, ok := l.take("a", 1000, t0.Add(time.Hour), true); !ok {
		t.Fatal("a full bucket refused its burst")
	}
	// MintBatch (not per identity) does not use a's bucket.
	if _, _, ok := l.take("a", 5000, t0.Add(time.Hour), false); !ok {
		t.Fatal("MintBatch refused by the per-identity bound")
	}

	// client_ids count for a minute after their last grant; usage is the
	// busiest identity's rate over the bound.
	l2 := newSharedLimiter(1000, 1e9)
	l2.sweep(t0)
	for i, id := range []string{"x", "y", "z"} {
		at := t0.Add(time.Duration(i) * 20 * time.Second)
		l2.take("a", 100, at, true)
		l2.settle("a", id, 100, 100, at, true)
	}
	if n, _, _ := l2.sweep(t0.Add(40 * time.Second)); n != 3 {
		t.Fatalf("%d clients within the minute, want 3", n)
	}
	if n, _, _ := l2.sweep(t0.Add(70 * time.Second)); n != 2 {
		t.Fatalf("%d clients after x's minute, want 2", n)
	}
	if l2.clientCount() != 2 {
		t.Fatalf("clientCount %d, want 2", l2.clientCount())
	}
	l3 := newSharedLimiter(1000, 1e9)
	l3.sweep(t0)
	var usage float64
	for s := 1; s <= 60; s++ {
		at := t0.Add(time.Duration(s) * time.Second)
		l3.take("busy", 900, at, true)
		l3.settle("busy", "c", 900, 900, at, true)
		l3.take("idle", 10, at, true)
		l3.settle("idle", "d", 10, 10, at, true)
		_, usage, _ = l3.sweep(at)
	}
	if usage < 0.85 || usage > 0.95 {
		t.Fatalf("usage %.3f after a minute at 900 of 1,000 IDs/s, want about 0.9", usage)
	}
}

// Refusals over the rate are logged at most once per sharedLogEvery, each
// line counting the refusals since the one before.
func TestSharedOverRateLogSpacing(t *testing.T) {
	l := newSharedLimiter(1000, 1e9)
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
		refused, log := l.refuse(sharedRateLimited, t0.Add(s.at))
		if refused[sharedRateLimited] != s.refused || log != s.log {
			t.Fatalf("step %d (at %v): refused %d, log %v; want %d, %v", i, s.at, refused[sharedRateLimited], log, s.refused, s.log)
		}
	}
}

// When the aggregate bound is spent, an identity below its fair share (the
// bound over the active identities) is still served, and one at or above
// it waits (fair_share) with the time until the aggregate holds its
// request; the debt the light identity runs up is bounded.
func TestSharedFairShare(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newSharedLimiter(1e9, 3000) // no per-identity bound: only the aggregate
	at := t0
	// Three identities active; a and b take 1,400 IDs each every 100 ms
	// (14,000 IDs/s, far over the 3,000 IDs/s they share), c 50 (500 IDs/s,
	// under its share of 1,000).
	refused := map[string]int{}
	granted := map[string]int{}
	reqs := []struct {
		ident string
		n     int64
	}{{"a", 1400}, {"b", 1400}, {"c", 50}}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 100 {
		at = t0.Add(time.Duration(step) * 100 * time.Millisecond)
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] }) // requests arrive in any order
		for _, r := range reqs {
			wait, reason, ok := l.take(r.ident, r.n, at, false)
			if !ok {
				if reason != sharedFairShare || wait <= 0 {
					t.Fatalf("step %d: %s refused with %q after %v, want %q and a delay", step, r.ident, reason, wait, sharedFairShare)
				}
				refused[r.ident]++
				continue
			}
			l.settle(r.ident, "", r.n, r.n, at, false)
			granted[r.ident] += int(r.n)
		}
		if _, _, active := l.sweep(at); step > 10 && active != 3 {
			t.Fatalf("step %d: %d identities active, want 3", step, active)
		}
	}
	if refused["c"] != 0 {
		t.Fatalf("the light identity was refused %d times under its share", refused["c"])
	}
	if refused["a"] == 0 || refused["b"] == 0 {
		t.Fatalf("the heavy identities were never refused: %v", refused)
	}
	if a, b := granted["a"], granted["b"]; a < (a+b)/4 || b < (a+b)/4 {
		t.Fatalf("the heavy identities shared the rest unevenly: %v", granted)
	}
	// 10 s at 3,000 IDs/s plus one second of burst, and c's share at most.
	if sum := granted["a"] + granted["b"] + granted["c"]; sum > 3000*11+granted["c"] {
		t.Fatalf("%d IDs granted in 10 s under a bound of 3,000 IDs/s (%v)", sum, granted)
	}
	t.Logf("granted %v, refused %v", granted, refused)
}

// The client_ids remembered stay within their bounds: one identity
// cycling fresh client_ids keeps at most maxClientsPerIdentity (its oldest
// go first), and all identities together at most maxSharedClients (the
// oldest of all go).
func TestSharedClientsBounded(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	x := newClientIndex()
	for i := range 3 * maxClientsPerIdentity {
		x.touch("flood", fmt.Sprintf("c%d", i), t0.Add(time.Duration(i)))
	}
	if x.len() != maxClientsPerIdentity {
		t.Fatalf("%d client_ids of one identity, want %d", x.len(), maxClientsPerIdentity)
	}
	if _, ok := x.entries[clientKey{"flood", "c0"}]; ok {
		t.Fatal("the oldest client_id stayed")
	}
	if _, ok := x.entries[clientKey{"flood", fmt.Sprintf("c%d", 3*maxClientsPerIdentity-1)}]; !ok {
		t.Fatal("the newest client_id went")
	}
	x.touch("other", "o", t0.Add(time.Hour))
	for i := range maxSharedClients / maxClientsPerIdentity {
		for j := range maxClientsPerIdentity {
			x.touch(fmt.Sprintf("id%d", i), fmt.Sprintf("c%d", j), t0.Add(time.Hour+time.Duration(i*maxClientsPerIdentity+j)))
		}
	}
	if x.len() != maxSharedClients {
		t.Fatalf("%d client_ids in all, want %d", x.len(), maxSharedClients)
	}
	if _, ok := x.entries[clientKey{"flood", fmt.Sprintf("c%d", 3*maxClientsPerIdentity-1)}]; ok {
		t.Fatal("the flooding identity's entries, the oldest of all, stayed")
	}
	x.prune(t0.Add(2 * time.Hour))
	if x.len() != 0 || len(x.byIdent) != 0 {
		t.Fatalf("%d entries of %d identities after pruning them all", x.len(), len(x.byIdent))
	}
}
