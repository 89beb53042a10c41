package service

import (
	"container/list"
	"math"
	"sync"
	"time"
)

// The bounds of what callers take from the replica's own codes
// (docs/design.md, "The shared path": the fairness rule).
const (
	// SharedRatePerCode is the default aggregate bound per code the
	// replica's minter may hold (--shared-rate-total 0): 3,000 IDs/ms, 73%
	// of what a code mints, so the codes keep room for bursts and the
	// pool takes its next code (at 75%) before the bound is reached.
	SharedRatePerCode = 3_000_000
	// fairWindow is the time constant of the per-identity rate the fair
	// share is judged on: short, so a tenant that just started is not
	// held to its past.
	fairWindow = time.Second
	// heavyLead: a caller above its fair share gets backpressure once the
	// replica's codes are this share of their lead bound ahead of the
	// clock, so the rest of the bound (a quarter: about 1M positions per
	// code) stays for the callers below it, whatever a burst of the
	// others does.
	heavyLead = 0.75
	// maxClientsPerIdentity and maxSharedClients bound the client_ids
	// remembered for shared_clients: per identity, and in all. Beyond
	// either, the oldest entries go (a client_id only names a client for
	// the metrics; nothing else reads it). At 128 bytes a client_id
	// (segment.MaxClientID), an entry takes about 300 bytes: 30 MB at
	// most, 3 MB per identity.
	maxClientsPerIdentity = 10_000
	maxSharedClients      = 100_000
)

// sharedLimiter bounds what callers take from the replica's own codes: a
// token bucket of IDs per identity for shared runs (--shared-rate), an
// aggregate bucket for shared runs and MintBatch together
// (--shared-rate-total), and the fair share when the aggregate is spent:
// an identity whose recent rate stays below the aggregate over the active
// identities with the request is served all the same (the aggregate goes
// into debt, at most one second of it), one that would go above it waits. It also keeps the
// bookkeeping for metrics: client_ids seen (bounded), rates per identity.
type sharedLimiter struct {
	rate, burst   float64 // per identity
	total, tburst float64 // all identities

	mu      sync.Mutex
	agg     float64   // aggregate tokens (negative: debt)
	aggAt   time.Time // when agg was last topped up
	buckets map[string]*sharedBucket
	active  int          // identities that asked within fairWindow (recounted by sweep)
	clients *clientIndex // client_id -> service time of its last grant
	last    time.Time    // last sweep
	pruned  time.Time    // last walk over clients

	refused  map[string]int // refusals by reason since the last log line
	loggedAt time.Time      // service time of the last log line about them
}

type sharedBucket struct {
	tokens   float64
	at       time.Time // service time tokens were last topped up
	recent   float64   // IDs/s taken, EWMA over fairWindow, as of recentAt
	recentAt time.Time
	askedAt  time.Time // service time of its last request, granted or not
	granted  float64   // IDs granted since the last sweep
	rate     float64   // IDs/s granted, EWMA over sharedUsageWindow
}

// newSharedLimiter bounds each identity's shared runs to rate IDs/s and all
// identities together to total IDs/s, one second of burst each.
func newSharedLimiter(rate, total float64) *sharedLimiter {
	return &sharedLimiter{rate: rate, burst: rate, total: total, tburst: total, agg: total,
		buckets: map[string]*sharedBucket{}, clients: newClientIndex(), refused: map[string]int{}}
}

// bucket is ident's bucket, topped up to now (created full).
func (l *sharedLimiter) bucket(ident string, now time.Time) *sharedBucket {
	b := l.buckets[ident]
	if b == nil {
		b = &sharedBucket{tokens: l.burst, at: now, recentAt: now}
		l.buckets[ident] = b
	}
	if dt := now.Sub(b.at); dt > 0 {
		b.tokens = min(l.burst, b.tokens+l.rate*dt.Seconds())
		b.at = now
	}
	if dt := now.Sub(b.recentAt); dt > 0 {
		b.recent *= math.Exp(-dt.Seconds() / fairWindow.Seconds())
		b.recentAt = now
	}
	if l.aggAt.IsZero() {
		l.aggAt = now
	}
	if dt := now.Sub(l.aggAt); dt > 0 {
		l.agg = min(l.tburst, l.agg+l.total*dt.Seconds())
		l.aggAt = now
	}
	return b
}

// take takes n IDs for ident at now: from its own bucket for a shared run
// (perIdentity; MintBatch is bounded only in aggregate), then from the
// aggregate, or past it when ident is below its fair share. Refused, it
// says why (a refusal reason of shared_refused_total) and how long until
// the request fits.
func (l *sharedLimiter) take(ident string, n int64, now time.Time, perIdentity bool) (retryAfter time.Duration, reason string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(ident, now)
	if now.Sub(b.askedAt) >= fairWindow {
		l.active++ // asking again: counted at once, not at the next sweep
	}
	b.askedAt = now
	f := float64(n)
	if perIdentity && b.tokens < f {
		return time.Duration(math.Ceil((f - b.tokens) / l.rate * 1e9)), sharedRateLimited, false
	}
	if l.agg < f {
		// Contention: the aggregate is spent. An identity that stays
		// within its fair share with this request is served into debt
		// (at most one second of it); one that would go past it waits
		// until the aggregate holds its request. The identities served
		// into debt take at most the aggregate rate together, and the
		// others cannot take from it while it is negative, so the debt
		// is paid back.
		share := l.total / float64(max(l.active, 1))
		if b.recent+f/fairWindow.Seconds() > share || l.agg-f < -l.tburst {
			return time.Duration(math.Ceil((f - l.agg) / l.total * 1e9)), sharedFairShare, false
		}
	}
	l.agg -= f
	if perIdentity {
		b.tokens -= f
	}
	b.recent += f / fairWindow.Seconds()
	return 0, "", true
}

// overShare reports whether ident takes more than its fair share at now:
// the aggregate bound, or what the codes held mint (capacity, IDs/s) if
// less, over the identities asking.
func (l *sharedLimiter) overShare(ident string, capacity float64, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[ident]
	if b == nil {
		return false
	}
	recent := b.recent * math.Exp(-max(now.Sub(b.recentAt).Seconds(), 0)/fairWindow.Seconds())
	return recent > min(l.total, capacity)/float64(max(l.active, 1))
}

// settle gives back the IDs a request took but did not use (k of n; k = 0
// when it failed), records the granted ones and, for a shared run,
// clientID.
func (l *sharedLimiter) settle(ident, clientID string, n, k int64, now time.Time, perIdentity bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	unused := float64(n - k)
	l.agg = min(l.tburst, l.agg+unused)
	if b := l.buckets[ident]; b != nil {
		if perIdentity {
			b.tokens = min(l.burst, b.tokens+unused)
		}
		b.recent = max(0, b.recent-unused/fairWindow.Seconds())
		b.granted += float64(k)
	}
	if k > 0 && perIdentity {
		l.clients.touch(ident, clientID, now)
	}
}

// refuse counts a refusal for reason at now and reports whether to log,
// with the refusals by reason since the last line: at most one line per
// sharedLogEvery, so a busy identity is visible at the default log level
// without a line per request.
func (l *sharedLimiter) refuse(reason string, now time.Time) (refused map[string]int, log bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused[reason]++
	if !l.loggedAt.IsZero() && now.Sub(l.loggedAt) < sharedLogEvery {
		return nil, false
	}
	refused, l.refused, l.loggedAt = l.refused, map[string]int{}, now
	return refused, true
}

// sweep forgets client_ids idle for sharedClientWindow and idle full
// buckets, updates the per-identity rates and the active identities, and
// returns the distinct client_ids left, the busiest identity's rate over
// the per-identity bound, and the identities active.
func (l *sharedLimiter) sweep(now time.Time) (clients int, usage float64, active int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.pruned) >= sharedPruneEvery {
		l.pruned = now
		l.clients.prune(now.Add(-sharedClientWindow))
	}
	dt := now.Sub(l.last).Seconds()
	if l.last.IsZero() || dt <= 0 {
		dt = 0
	}
	l.last = now
	alpha := 1 - math.Exp(-dt/sharedUsageWindow.Seconds())
	l.active = 0
	for ident, b := range l.buckets {
		if dt > 0 {
			b.rate += alpha * (b.granted/dt - b.rate)
		}
		b.granted = 0
		usage = max(usage, b.rate/l.rate)
		if now.Sub(b.askedAt) < fairWindow {
			l.active++ // asking, granted or not: its share is reserved
		}
		full := b.tokens+l.rate*now.Sub(b.at).Seconds() >= l.burst
		if full && now.Sub(b.at) > sharedClientWindow && b.rate < 1 {
			delete(l.buckets, ident)
		}
	}
	return l.clients.len(), usage, l.active
}

// clientCount is the number of distinct client_ids granted a run within
// the last minute (as of the last walk, sharedPruneEvery at most ago).
func (l *sharedLimiter) clientCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clients.len()
}

// clientIndex remembers client_ids per identity, each with the time of its
// last grant, bounded per identity and in all: beyond either bound the
// oldest entry goes (of the identity, or the oldest of all).
type clientIndex struct {
	byIdent map[string]*list.List // identity -> its entries, oldest first
	entries map[clientKey]*list.Element
}

type clientKey struct{ ident, id string }

type clientEntry struct {
	key clientKey
	at  time.Time
}

func newClientIndex() *clientIndex {
	return &clientIndex{byIdent: map[string]*list.List{}, entries: map[clientKey]*list.Element{}}
}

func (x *clientIndex) len() int { return len(x.entries) }

// touch records a grant to (ident, id) at at.
func (x *clientIndex) touch(ident, id string, at time.Time) {
	k := clientKey{ident, id}
	l := x.byIdent[ident]
	if e, ok := x.entries[k]; ok {
		e.Value.(*clientEntry).at = at
		l.MoveToBack(e)
		return
	}
	if l != nil && l.Len() >= maxClientsPerIdentity {
		x.remove(l.Front())
	} else if len(x.entries) >= maxSharedClients {
		x.removeOldest()
	}
	if l = x.byIdent[ident]; l == nil { // remove may have dropped it
		l = list.New()
		x.byIdent[ident] = l
	}
	x.entries[k] = l.PushBack(&clientEntry{key: k, at: at})
}

// remove forgets entry e.
func (x *clientIndex) remove(e *list.Element) {
	k := e.Value.(*clientEntry).key
	l := x.byIdent[k.ident]
	l.Remove(e)
	delete(x.entries, k)
	if l.Len() == 0 {
		delete(x.byIdent, k.ident)
	}
}

// removeOldest forgets the oldest entry of all: the oldest of the
// identities' oldest (one step per identity remembered).
func (x *clientIndex) removeOldest() {
	var oldest *list.Element
	for _, l := range x.byIdent {
		if f := l.Front(); oldest == nil || f.Value.(*clientEntry).at.Before(oldest.Value.(*clientEntry).at) {
			oldest = f
		}
	}
	if oldest != nil {
		x.remove(oldest)
	}
}

// prune forgets the entries whose last grant is before cutoff.
func (x *clientIndex) prune(cutoff time.Time) {
	for _, l := range x.byIdent {
		for f := l.Front(); f != nil && f.Value.(*clientEntry).at.Before(cutoff); f = l.Front() {
			x.remove(f)
		}
	}
}
