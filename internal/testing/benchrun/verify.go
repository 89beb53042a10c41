package benchrun

import (
	"fmt"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// newChecker is the verification of a run that begins at begin. A client
// that loses its lease takes a new one, possibly another code of its
// region: every code of the fleet's regions is allowed, and each worker
// checks that its IDs carry its own region (keep).
func newChecker(env *Env, cfg Config, begin time.Time) (*measure.Checker, error) {
	regionCodes := make([]int, cfg.Regions)
	for i := range regionCodes {
		regionCodes[i] = env.regions[i].RegionID()
	}
	expect := measure.Codes(regionCodes, snowflake.MaxWorker+1)
	leadSlack := segment.DefaultMaxLead // the regions run the default policy
	return measure.NewChecker(measure.CheckConfig{
		Expect:    expect, // a worker that minted nothing is reported (Verify.MissingCodes), not a failure
		NotBefore: begin.Add(-time.Second),
		NotAfter:  begin.Add(cfg.Duration + leadSlack + 5*time.Second),
		Capacity:  int(min(cfg.Rate*cfg.Duration.Seconds()*1.05, 1<<31)) + 1<<16,
	})
}

// verify checks every ID kept and records the result (verifyErr on any
// failure).
func (rep *Report) verify(cfg Config, checker *measure.Checker, workers []*worker) {
	fmt.Fprintf(cfg.Progress, "bench: verifying %d IDs\n", checker.Len())
	vstart := time.Now()
	res := checker.Check()
	rep.VerifyTime = Dur(time.Since(vstart))
	// MissingCodes are the dedicated workers' first codes that minted nothing, not
	// the checker's (every code of the fleet's regions is allowed, few are used).
	rep.Verify = VerifySummary{
		Checked: res.Checked, Unique: res.Unique, Duplicates: res.Duplicates, DuplicateExamples: res.DuplicateExamples,
		OutOfRange: res.OutOfRange, OutOfRangeExamples: res.OutOfRangeExamples, Codes: len(res.Codes),
	}
	for _, w := range workers {
		rep.Verify.OutOfRange += w.foreign
		if room := measure.DefaultMaxExamples - len(rep.Verify.OutOfRangeExamples); room > 0 {
			rep.Verify.OutOfRangeExamples = append(rep.Verify.OutOfRangeExamples, w.foreignEx[:min(room, len(w.foreignEx))]...)
		}
		// A worker's first lease is not a change: a dedicated worker's
		// came with New, a Codes-0 worker's is its move off the shared path.
		if acq := w.c.Stats().Acquisitions; acq > 0 {
			rep.LeaseChanges += acq - 1
			if w.shared {
				rep.SharedTookCode++
			}
		}
	}
	seen := map[int]bool{}
	for _, cc := range res.Codes {
		seen[cc.Region<<snowflake.WorkerBits|cc.Worker] = true
	}
	for _, w := range workers {
		switch {
		case w.shared && w.n == 0:
			rep.Verify.IdleSharedWorkers++
		case !w.shared && !seen[w.code.Region<<snowflake.WorkerBits|w.code.Worker]:
			rep.Verify.MissingCodes = append(rep.Verify.MissingCodes, w.code)
		}
	}
	switch {
	case res.Checked != rep.IDs && cfg.Sink == nil:
		rep.verifyErr = errors.Newf("bench: %d IDs minted but %d checked", rep.IDs, res.Checked)
	case res.Err() != nil:
		rep.verifyErr = res.Err()
	case rep.Verify.OutOfRange > 0:
		rep.verifyErr = errors.Wrapf(measure.ErrOutOfRange, "%d IDs carry another region than their client's, e.g. %d (%s)",
			rep.Verify.OutOfRange, rep.Verify.OutOfRangeExamples[0].ID, rep.Verify.OutOfRangeExamples[0].Reason)
	}
	if rep.verifyErr != nil {
		rep.Verify.Problem = rep.verifyErr.Error()
	}
	fmt.Fprintf(cfg.Progress, "bench: verified %d IDs in %v: %d duplicates, %d out of range\n",
		res.Checked, time.Duration(rep.VerifyTime).Round(time.Millisecond), res.Duplicates, rep.Verify.OutOfRange)
}
