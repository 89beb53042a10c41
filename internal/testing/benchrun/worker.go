package benchrun

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/snowflake"
)

// worker is one client and what was measured of it. Its goroutine owns
// every field but minted.
type worker struct {
	region, index int
	code          measure.Code // the first code held; zero for a Codes-0 worker
	shared        bool         // started with Codes 0 (on the shared path)
	c             *engine.Engine
	lat           *latencies // shared with the workers of its shard

	n      int64 // IDs kept
	done   int64 // paced IDs minted
	window int64 // paced IDs returned by the end of the window
	// foreign counts IDs whose region field is not the worker's region.
	foreign   int64
	foreignEx []measure.Bad
	minted    atomic.Int64 // n as of the last tick, read by the progress line
	slow      uint64
	errs      int64
	err       error
	buf       []snowflake.ID

	burst *burstStats // the burst profile, for the one worker that runs it
}

// burstStats is what the burst profile measured.
type burstStats struct {
	next     time.Time
	hist     measure.Histogram
	dur      measure.Histogram
	count    int
	inBudget int
	ids      int64
}

// latencies are the per-ID latency and tick lateness of a shard of
// workers. A fleet of up to maxShards workers gives each worker its own
// (no lock is ever contended); a larger one shares maxShards of them, so
// their memory (30 KiB a histogram) stays that of the default fleet.
type latencies struct {
	mu   sync.Mutex
	hist measure.Histogram // per ID (each Next call)
	late measure.Histogram // tick lateness
}

func (l *latencies) record(h *measure.Histogram, d time.Duration) {
	l.mu.Lock()
	h.Record(d)
	l.mu.Unlock()
}

// shardLatencies gives every worker its shard of latencies (consecutive
// workers share one) and returns the shards.
func shardLatencies(workers []*worker) []*latencies {
	size := (len(workers) + maxShards - 1) / maxShards
	ls := make([]*latencies, 0, (len(workers)+size-1)/size)
	for i, w := range workers {
		if i%size == 0 {
			ls = append(ls, &latencies{})
		}
		w.lat = ls[len(ls)-1]
	}
	return ls
}

// run is one worker's paced loop: on each tick it mints what a token
// bucket at rate IDs/s says it owes since begin.
func (w *worker) run(ctx context.Context, cfg Config, begin, end time.Time, offset time.Duration, rate float64, checker *measure.Checker) {
	defer func() {
		w.flush(cfg, checker)
		w.minted.Store(w.n)
	}()
	if !sleepUntil(ctx, begin.Add(offset)) {
		return
	}
	if w.burst != nil {
		w.burst.next = begin.Add(offset + cfg.BurstEvery/2)
	}
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	for {
		var tick time.Time
		select {
		case <-ctx.Done():
			return
		case tick = <-t.C:
		}
		now := time.Now()
		w.lat.record(&w.lat.late, now.Sub(tick))
		// The last tick is the last one before the end: it settles what
		// is owed up to the end (at most one tick early), so a coarse tick
		// does not leave the IDs of the run's last partial tick to be
		// minted after it.
		last := !now.Add(cfg.Tick).Before(end)
		if !w.step(ctx, cfg, begin, end, last, rate, checker) || last {
			return
		}
	}
}

// step is one tick of the worker: its burst when due, then the paced IDs
// it owes. On the last tick (last) it settles what is owed up to end
// exactly, so a worker that kept up mints rate × Duration. It returns
// false when the run is over.
func (w *worker) step(ctx context.Context, cfg Config, begin, end time.Time, last bool, rate float64, checker *measure.Checker) bool {
	now := time.Now()
	if last {
		now = end
	}
	if w.burst != nil && !last && !now.Before(w.burst.next) {
		if !w.runBurst(ctx, cfg, checker) {
			return false
		}
		w.burst.next = w.burst.next.Add(cfg.BurstEvery)
		now = time.Now()
	}
	owed := int64(rate*now.Sub(begin).Seconds()) - w.done
	if last {
		now = time.Now()
	}
	defer func() { w.minted.Store(w.n) }()
	for range owed {
		id, d, ok := w.next(ctx, &now)
		if !ok {
			return false
		}
		w.lat.record(&w.lat.hist, d)
		w.keep(cfg, checker, id)
		w.done++
		if !now.After(end) {
			w.window++
		}
	}
	return true
}

// next mints one ID and times it; now is advanced to the reading after the
// call. It returns false when the run is over.
func (w *worker) next(ctx context.Context, now *time.Time) (snowflake.ID, time.Duration, bool) {
	for {
		t0 := time.Now()
		id, err := w.c.Next(ctx)
		*now = time.Now()
		d := now.Sub(t0)
		if d > time.Millisecond {
			w.slow++
		}
		if err == nil {
			return id, d, true
		}
		if ctx.Err() != nil {
			return 0, 0, false
		}
		w.errs++
		if w.err == nil {
			w.err = err
		}
		if !engine.IsRetryable(err) {
			return 0, 0, false
		}
		if !sleepUntil(ctx, now.Add(time.Millisecond)) {
			return 0, 0, false
		}
		*now = time.Now()
	}
}

// runBurst asks for BurstSize IDs back to back.
func (w *worker) runBurst(ctx context.Context, cfg Config, checker *measure.Checker) bool {
	b := w.burst
	start := time.Now()
	now := start
	for range cfg.BurstSize {
		id, d, ok := w.next(ctx, &now)
		if !ok {
			return false
		}
		w.lat.record(&w.lat.hist, d)
		b.hist.Record(d)
		w.keep(cfg, checker, id)
		b.ids++
	}
	d := now.Sub(start)
	b.dur.Record(d)
	b.count++
	if d <= BurstBudget {
		b.inBudget++
	}
	return true
}

func (w *worker) keep(cfg Config, checker *measure.Checker, id snowflake.ID) {
	w.n++
	w.buf = append(w.buf, id)
	if len(w.buf) == cap(w.buf) {
		w.flush(cfg, checker)
	}
}

func (w *worker) flush(cfg Config, checker *measure.Checker) {
	ids := w.buf
	if cfg.Sink != nil {
		ids = cfg.Sink(w.region, w.index, ids)
	}
	for _, id := range ids {
		// A region outside the fleet is already out of range for idcheck
		// (not an expected code); count only the ones it cannot see.
		if r := id.Region(); r != w.region && r < cfg.Regions {
			w.foreign++
			if len(w.foreignEx) < 3 {
				w.foreignEx = append(w.foreignEx, measure.Bad{ID: int64(id),
					Reason: fmt.Sprintf("region field %d from a client of region %d", id.Region(), w.region)})
			}
		}
	}
	checker.Add(ids...)
	w.buf = w.buf[:0]
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-time.After(time.Until(t)):
		return true
	case <-ctx.Done():
		return false
	}
}
