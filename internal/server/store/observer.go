package store

import "time"

// Observer receives the Store's metric events (the service wires them to
// Prometheus; segment itself imports no metrics library). Every method must
// be cheap, non-blocking and safe for concurrent use, and must not call the
// Store (HighWaterRegressed and HighWaterRecovered are called under its
// lock, so that they arrive in the order the Store decided them). Embed NopObserver to
// implement only some. Events are only reported for requests whose region
// (and lease fields) are in range, so region and worker are always valid
// label values; requests rejected as ErrInvalid before touching etcd are
// not reported.
type Observer interface {
	// Granted: a block of size L units was committed; latency covers the
	// whole Allocate (reads, retries, commit).
	Granted(region, worker int, size int64, latency time.Duration)
	// GrantFailed: Allocate returned err (classify with errors.Is).
	GrantFailed(region, worker int, err error, latency time.Duration)
	// Conflict: a grant transaction failed its compare because another
	// replica committed first (or signalled contention) and is retried.
	Conflict(region, worker int)
	// Acquired: a code was leased; AcquireFailed: Acquire returned err.
	Acquired(region, worker int)
	AcquireFailed(region int, err error)
	// Renewed: Renew returned err (nil on success).
	Renewed(region, worker int, err error)
	// Released: Release returned err (nil on success).
	Released(region, worker int, err error)
	// Corrupt: a stored value under key does not decode; grants on that
	// code stop until it is repaired.
	Corrupt(key string, err error)
	// HighWaterRegressed: the stored high-water mark of a code (seen; 0
	// when the key is absent) is below floor, the highest this Store
	// committed or read for it: the store went back. Grants on the code
	// are refused with ErrHighWaterRegressed and Acquire skips it. Reported
	// once when the code becomes refused, not on every refused call.
	HighWaterRegressed(region, worker int, floor, seen int64)
	// HighWaterRecovered: a code reported by HighWaterRegressed shows a
	// mark at or above its floor again (a restore fence lifted it); grants
	// on it resume.
	HighWaterRecovered(region, worker int)
}

// NopObserver ignores every event. Its methods do nothing.
type NopObserver struct{}

func (NopObserver) Granted(int, int, int64, time.Duration)     {}
func (NopObserver) GrantFailed(int, int, error, time.Duration) {}
func (NopObserver) Conflict(int, int)                          {}
func (NopObserver) Acquired(int, int)                          {}
func (NopObserver) AcquireFailed(int, error)                   {}
func (NopObserver) Renewed(int, int, error)                    {}
func (NopObserver) Released(int, int, error)                   {}
func (NopObserver) Corrupt(string, error)                      {}
func (NopObserver) HighWaterRegressed(int, int, int64, int64)  {}
func (NopObserver) HighWaterRecovered(int, int)                {}
