package engine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/idrange/idrange/segment"
)

// codeEnds is the client's own check of the invariant every grant rests
// on: a code's high-water mark only grows, so the blocks of one code never
// overlap, whoever holds them. The service enforces it (fenced commits, and
// each replica's floor); the client checks it again on what it receives,
// so a service or store that misbehaves (a tampered or restored etcd, a
// bug) cannot make it mint an ID twice unnoticed.
//
// Per code the client has held, for its whole life and across leases, it
// remembers the newest lease's token, the start of that lease's first
// block and the end of its last one. A block is accepted only if it starts
// at or above that end (same or newer lease). A late reply for an older
// lease must end at or below the newer lease's first block; it is never
// minted from (its lease is not current) and does not move the end. One
// codeEnds is shared by all of a client's codes (Config.Codes): a code one
// of them gave up may be taken by another.
type codeEnds struct {
	mu sync.Mutex
	m  map[[2]int]codeEnd
}

type codeEnd struct{ token, lo, hi int64 }

func newCodeEnds() *codeEnds { return &codeEnds{m: map[[2]int]codeEnd{}} }

// admit checks b, granted under token, against the blocks the client was
// granted before on its code and records it: nil, or an error wrapping
// ErrOverlap (and segment.ErrCorrupt) if b overlaps one of them.
func (e *codeEnds) admit(b segment.Block, token int64) error {
	k := [2]int{b.Region, b.Worker}
	e.mu.Lock()
	defer e.mu.Unlock()
	last, seen := e.m[k]
	switch {
	case !seen || (token >= last.token && b.Lo >= last.hi):
		if !seen || token > last.token {
			last = codeEnd{token: token, lo: b.Lo}
		}
		last.hi = b.Hi
		e.m[k] = last
		return nil
	case token < last.token && b.Hi <= last.lo:
		return nil
	}
	end := last.hi
	if token < last.token {
		end = last.lo // a late block of an older lease must end below the newer one's
	}
	return mark(fmt.Errorf("block [%d,%d) of code %d/%d (token %d) overlaps space below %d this client was granted before (token %d); nothing minted from it: %w",
		b.Lo, b.Hi, b.Region, b.Worker, token, end, last.token, ErrOverlap), segment.ErrCorrupt)
}

// isUnsafeCode reports a refill error after which the held code must not
// be granted on again: the service granted an overlapping block, or it
// refuses the code because its high-water mark went back. The client drops
// the lease and takes another code (dropCode).
func isUnsafeCode(err error) bool {
	return errors.Is(err, ErrOverlap) || errors.Is(err, segment.ErrHighWaterRegressed)
}

// dropCode stops minting on l's code at once because the code cannot be
// granted on safely (isUnsafeCode); the lease loop takes another code. The
// lease is not released: the code stays leased to this client until its
// TTL ends, so it is not handed straight back to this client or another.
func (c *lane) dropCode(l *leaseState, cause error) {
	err := fmt.Errorf("rangeclient: code %d/%d (token %d) given up; taking another code: %w",
		l.seg.Region, l.seg.Worker, l.seg.Token, cause)
	if c.killLease(l, err) {
		c.stats.dropped.Add(1)
		c.log.Error("rangeclient: the code's blocks cannot be trusted; minting on it stopped, taking another code",
			"worker", l.seg.Worker, "token", l.seg.Token, "err", cause)
	}
}
