package faultsuite

import (
	"testing"
	"time"

	"github.com/idrange/idrange/internal/faultsuite/history"
)

// The measurements behind issue 9's acceptance scenarios, on hand-made
// histories (times in ms).

const ms = int64(time.Millisecond)

func TestLongestGapSubtractsPacing(t *testing.T) {
	mint := func(t0, t1 int64) history.Mint { return history.Mint{T0: t0 * ms, T1: t1 * ms, IDs: []int64{1}} }
	a := &history.History{Header: history.Header{Name: "a"}, Mints: []history.Mint{mint(0, 1), mint(10, 11), mint(20, 21), mint(30, 101), mint(101, 102)}}
	b := &history.History{Header: history.Header{Name: "b"}, Mints: []history.Mint{mint(0, 1), mint(10, 41), mint(50, 51)}}
	pacing := 10 * time.Millisecond
	if g := longestGap([]*history.History{a, b}, pacing, 0, 1<<62); g.name != "a" || g.d != 70*time.Millisecond || g.at != 101*ms {
		t.Errorf("whole run: got %+v, want a's call blocked 70 ms beyond pacing, ending at 101 ms", g)
	}
	// Calls returning outside [a, b] are not counted.
	if g := longestGap([]*history.History{a, b}, pacing, 0, 60*ms); g.name != "b" || g.d != 30*time.Millisecond {
		t.Errorf("until 60 ms: got %+v, want b's 30 ms", g)
	}
	if g := longestGap([]*history.History{a}, pacing, 0, 25*ms); g.d != 0 {
		t.Errorf("steady pacing: got %+v, want no gap", g)
	}
}

func TestLongestWaitLeavesOutTheMintersSleep(t *testing.T) {
	mint := func(t0, t1 int64) history.Mint { return history.Mint{T0: t0 * ms, T1: t1 * ms, IDs: []int64{1}} }
	fail := func(t0, t1 int64) history.MintFailure {
		return history.MintFailure{T0: t0 * ms, T1: t1 * ms, Class: "timeout"}
	}
	h := &history.History{Header: history.Header{Name: "a"},
		Mints: []history.Mint{
			mint(0, 1), mint(10, 11), mint(20, 21), // steady
			mint(470, 471), // after two refusals from 30 ms
			mint(480, 560), // blocked in the client
			mint(900, 901), // the minter woke 330 ms late: not the client's doing
		},
		Failures: []history.MintFailure{fail(30, 230), fail(250, 450)},
	}
	hs := []*history.History{h}
	if g := longestWait(hs, 0, 1<<62); g.d != 441*time.Millisecond || g.at != 471*ms || g.call != time.Millisecond {
		t.Errorf("whole run: got %+v, want 441 ms from the first refusal to the IDs at 471 ms", g)
	}
	if g := longestWait(hs, 500*ms, 1<<62); g.d != 80*time.Millisecond {
		t.Errorf("from 500 ms: got %v, want the 80 ms blocked call", g)
	}
	if g := longestWait(hs, 0, 100*ms); g.d != time.Millisecond {
		t.Errorf("steady part: got %v, want 1 ms", g)
	}
	if g := longestGap(hs, 10*time.Millisecond, 500*ms, 1<<62); g.d != 331*time.Millisecond {
		t.Errorf("paced gap from 500 ms: got %v, want 331 ms (it counts the late wake-up)", g)
	}
}

func TestOwnDeadlineDatesRetriesFromTheFirstAttempt(t *testing.T) {
	h := &history.History{
		Header: history.Header{Name: "m", Margin: time.Second},
		Leases: []history.Lease{{Send: 0, Ret: 5 * ms, Token: 7, TTL: 4 * time.Second}},
		Renewals: []history.Renewal{
			{Send: 1000 * ms, Ret: 1005 * ms, Token: 7, TTL: 4 * time.Second},
			// Succeeded on the second replica after the first timed out
			// (sent at 2000 ms) and after a failure of another call.
			{Send: 2502 * ms, Ret: 2510 * ms, Token: 7, TTL: 4 * time.Second},
		},
		Failed: []history.FailedCall{
			{Send: 1500 * ms, Ret: 1520 * ms, Method: "renew", Token: 7, Reason: "Unavailable"},      // backoff after: not a chain
			{Send: 2000 * ms, Ret: 2500 * ms, Method: "renew", Token: 7, Reason: "DeadlineExceeded"}, // retried at once
			{Send: 2400 * ms, Ret: 2501 * ms, Method: "allocate", Token: 7, Reason: "Unavailable"},   // another method
		},
	}
	if dl, ok := ownDeadline(h, 7, 2000*ms); !ok || dl != 4000*ms {
		t.Errorf("at 2 s: %v %v, want 4 s (the first renewal's send + 3 s)", time.Duration(dl), ok)
	}
	if dl, ok := ownDeadline(h, 7, 3000*ms); !ok || dl != 5000*ms {
		t.Errorf("at 3 s: %v %v, want 5 s (the retried renewal dated from its first attempt)", time.Duration(dl), ok)
	}
	if b, _ := h.DeadlineBound(7, 3000*ms); b != 5502*ms {
		t.Errorf("checker's bound at 3 s: %v, want 5.502 s", time.Duration(b))
	}
	if _, ok := ownDeadline(h, 8, 3000*ms); ok {
		t.Error("a deadline for a lease the process never held")
	}
}
