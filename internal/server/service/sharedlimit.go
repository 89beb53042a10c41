package service

import (
	"math"
	"sync"
	"time"
)

// sharedLimiter is the shared path's bound per identity (a token bucket of
// IDs) and its bookkeeping for metrics: client_ids seen, rates per identity.
type sharedLimiter struct {
	rate, burst float64

	mu      sync.Mutex
	buckets map[string]*sharedBucket
	clients map[string]time.Time // client_id -> service time of its last grant
	last    time.Time            // last sweep
	pruned  time.Time            // last walk over clients

	refused  int       // refusals over the rate since the last log line
	loggedAt time.Time // service time of the last log line about them
}

type sharedBucket struct {
	tokens  float64
	at      time.Time // service time tokens were last topped up
	granted float64   // IDs granted since the last sweep
	rate    float64   // IDs/s granted, EWMA over sharedUsageWindow
}

func newSharedLimiter(rate float64) *sharedLimiter {
	return &sharedLimiter{rate: rate, burst: rate, buckets: map[string]*sharedBucket{}, clients: map[string]time.Time{}}
}

// take takes n IDs from ident's bucket at now, or says how long until it
// holds them.
func (l *sharedLimiter) take(ident string, n int64, now time.Time) (retryAfter time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[ident]
	if b == nil {
		b = &sharedBucket{tokens: l.burst, at: now}
		l.buckets[ident] = b
	}
	if dt := now.Sub(b.at); dt > 0 {
		b.tokens = min(l.burst, b.tokens+l.rate*dt.Seconds())
		b.at = now
	}
	if b.tokens < float64(n) {
		return time.Duration(math.Ceil((float64(n) - b.tokens) / l.rate * 1e9)), false
	}
	b.tokens -= float64(n)
	return 0, true
}

// overRate counts a refusal over the rate at now and reports whether to log
// it, with the refusals since the last line: at most one line per
// sharedLogEvery, so a busy identity is visible at the default log level
// without a line per request.
func (l *sharedLimiter) overRate(now time.Time) (refused int, log bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused++
	if !l.loggedAt.IsZero() && now.Sub(l.loggedAt) < sharedLogEvery {
		return 0, false
	}
	refused, l.refused, l.loggedAt = l.refused, 0, now
	return refused, true
}

// settle gives back the asked IDs a carve did not use and records the
// granted ones (k of n; k = 0 when the carve failed) for clientID.
func (l *sharedLimiter) settle(ident, clientID string, n, k int64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.buckets[ident]; b != nil {
		b.tokens = min(l.burst, b.tokens+float64(n-k))
		b.granted += float64(k)
	}
	if k == 0 {
		return
	}
	if _, seen := l.clients[clientID]; seen || len(l.clients) < maxSharedClients {
		l.clients[clientID] = now
	}
}

// sweep forgets client_ids idle for sharedClientWindow and idle full
// buckets, updates the per-identity rates and returns the distinct
// client_ids left and the busiest identity's rate over the bound.
func (l *sharedLimiter) sweep(now time.Time) (clients int, usage float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.pruned) >= sharedPruneEvery {
		l.pruned = now
		for id, at := range l.clients {
			if now.Sub(at) > sharedClientWindow {
				delete(l.clients, id)
			}
		}
	}
	dt := now.Sub(l.last).Seconds()
	if l.last.IsZero() || dt <= 0 {
		dt = 0
	}
	l.last = now
	alpha := 1 - math.Exp(-dt/sharedUsageWindow.Seconds())
	for ident, b := range l.buckets {
		if dt > 0 {
			b.rate += alpha * (b.granted/dt - b.rate)
		}
		b.granted = 0
		usage = max(usage, b.rate/l.rate)
		full := b.tokens+l.rate*now.Sub(b.at).Seconds() >= l.burst
		if full && now.Sub(b.at) > sharedClientWindow && b.rate < 1 {
			delete(l.buckets, ident)
		}
	}
	return len(l.clients), usage
}

// clientCount is the number of distinct client_ids granted a run within
// the last minute (as of the last walk, sharedPruneEvery at most ago).
func (l *sharedLimiter) clientCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.clients)
}
