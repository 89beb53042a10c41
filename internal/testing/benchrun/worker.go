package benchrun

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/snowflake"
)

// worker is one client and what its goroutine measured.
type worker struct {
	region, index int
	code          measure.Code
	c             *rangeclient.Client

	n      int64 // IDs kept (owned by the worker's goroutine)
	window int64 // paced IDs returned by the end of the window
	// foreign counts IDs whose region field is not the worker's region.
	foreign   int64
	foreignEx []measure.Bad
	minted    atomic.Int64 // n as of the last tick, read by the progress line
	hist      measure.Histogram
	late      measure.Histogram
	slow      uint64
	errs      int64
	err       error
	buf       []snowflake.ID

	burst      bool
	burstHist  measure.Histogram
	burstDur   measure.Histogram
	bursts     int
	burstsInBg int
	burstIDs   int64
}

// run is one worker's paced loop.
func (w *worker) run(ctx context.Context, cfg Config, begin, end time.Time, offset time.Duration, rate float64, checker *measure.Checker) {
	defer func() {
		w.flush(cfg, checker)
		w.minted.Store(w.n)
	}()
	if !sleepUntil(ctx, begin.Add(offset)) {
		return
	}
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	var done int64
	nextBurst := begin.Add(offset + cfg.BurstEvery/2)
	for {
		var tick time.Time
		select {
		case <-ctx.Done():
			return
		case tick = <-t.C:
		}
		now := time.Now()
		w.late.Record(now.Sub(tick))
		last := !now.Before(end)
		if last {
			// The final tick settles what is owed up to the end exactly,
			// so a worker that kept up mints rate × Duration.
			now = end
		}
		if w.burst && !last && !now.Before(nextBurst) {
			if !w.runBurst(ctx, cfg, checker) {
				return
			}
			nextBurst = nextBurst.Add(cfg.BurstEvery)
			now = time.Now()
		}
		owed := int64(rate*now.Sub(begin).Seconds()) - done
		if last {
			now = time.Now()
		}
		for range owed {
			id, d, ok := w.next(ctx, &now)
			if !ok {
				return
			}
			w.hist.Record(d)
			w.keep(cfg, checker, id)
			done++
			if !now.After(end) {
				w.window++
			}
		}
		w.minted.Store(w.n)
		if last {
			return
		}
	}
}

// next mints one ID and times it; now is advanced to the reading after the
// call. It returns false when the run is over.
func (w *worker) next(ctx context.Context, now *time.Time) (snowflake.ID, time.Duration, bool) {
	for {
		t0 := *now
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
		if !rangeclient.IsRetryable(err) {
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
	start := time.Now()
	now := start
	for range cfg.BurstSize {
		id, d, ok := w.next(ctx, &now)
		if !ok {
			return false
		}
		w.hist.Record(d)
		w.burstHist.Record(d)
		w.keep(cfg, checker, id)
		w.burstIDs++
	}
	d := now.Sub(start)
	w.burstDur.Record(d)
	w.bursts++
	if d <= BurstBudget {
		w.burstsInBg++
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
