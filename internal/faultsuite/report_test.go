package faultsuite

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/idrange/idrange/internal/faultsuite/history"
)

// reportEnv names the file the figures of every scenario are appended to
// (a Markdown table), in addition to the test log.
const reportEnv = "IDRANGE_FAULT_REPORT"

// figures are one scenario's numbers.
type figures struct {
	// ids are the IDs in the run's one duplicate check: every minter's
	// and every reply's the scenario received from a replica.
	ids, duplicates int64
	faults          int
	// failClosed is the longest time any client took from the fault to its
	// first refused call with no success after it; ranOn the longest it
	// kept handing out IDs after the fault (its buffers). -1: not measured.
	failClosed, ranOn time.Duration
	// recovered is the longest time any client took from the repair to its
	// first successful call. -1: not measured.
	recovered time.Duration
	// Allowed losses ("IDs lost to gaps" = gapPositions + burnedPositions):
	// positions of received blocks never handed out (at a few thousand IDs/s
	// the time-following cursor skips most of every block by design), and
	// HWM steps committed in etcd but received by no client.
	gapPositions, burnedGrants, burnedPositions, unusedBlocks int64
	failedCalls                                               int
	notes                                                     string
}

func (s *suite) figures(res result) figures {
	f := figures{ids: res.rep.IDs + res.rep.ReplyIDs, duplicates: res.rep.Duplicates, faults: s.faults,
		failClosed: -1, ranOn: -1, recovered: -1,
		gapPositions: res.rep.GapPositions, burnedGrants: res.rep.BurnedGrants,
		burnedPositions: res.rep.BurnedPosition, unusedBlocks: res.rep.UnusedBlocks}
	for _, h := range res.hists {
		f.failedCalls += len(h.Failures)
	}
	if res.rep.AfterBlockValid > 0 {
		f.notes = fmt.Sprintf("%d IDs from blocks past their validity (up to %v). ", res.rep.AfterBlockValid,
			res.rep.MaxBlockOverrun.Round(time.Microsecond))
	}
	return f
}

// outage measures, over the given histories, how clients behaved between a
// fault at k and its repair at q: how long they kept minting (ranOn), when
// they failed closed, and how long they took to mint again after q. ok is
// false for a history that never failed closed in (k, q).
func outage(hs []*history.History, k, q int64) (ranOn, failClosed, recovered time.Duration, closedAll, recoveredAll bool) {
	closedAll, recoveredAll = true, true
	for _, h := range hs {
		last, ok := h.LastMintBefore(q)
		from := k
		if ok && last.T1 > k {
			ranOn = max(ranOn, time.Duration(last.T1-k))
			from = last.T1
		}
		if fl, ok := h.FirstFailureAfter(from); ok && fl.T0 < q {
			failClosed = max(failClosed, time.Duration(fl.T1-k))
		} else {
			closedAll = false
		}
		if m, ok := h.FirstMintAfter(q); ok {
			recovered = max(recovered, time.Duration(m.T1-q))
		} else {
			recoveredAll = false
		}
	}
	return ranOn, failClosed, recovered, closedAll, recoveredAll
}

var reportMu sync.Mutex

// publish logs the figures and appends them to $IDRANGE_FAULT_REPORT.
func (s *suite) publish(f figures) {
	s.t.Helper()
	d := func(x time.Duration) string {
		if x < 0 {
			return "-"
		}
		return x.Round(time.Millisecond).String()
	}
	elapsed := time.Since(s.start).Round(100 * time.Millisecond)
	lost := f.gapPositions + f.burnedPositions
	s.t.Logf("FIGURES %s: ids_checked=%d faults=%d ran_on_buffers=%s time_to_fail_closed=%s time_to_recover=%s "+
		"duplicates=%d ids_lost_to_gaps=%d (unused positions of received blocks %d + burned grants %d of %d positions) "+
		"unused_blocks=%d failed_calls=%d elapsed=%v %s",
		s.name, f.ids, f.faults, d(f.ranOn), d(f.failClosed), d(f.recovered), f.duplicates, lost,
		f.gapPositions, f.burnedGrants, f.burnedPositions, f.unusedBlocks, f.failedCalls, elapsed, f.notes)
	path := os.Getenv(reportEnv)
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	fi, err := os.Stat(path)
	newFile := err != nil || fi.Size() == 0
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Errorf("%s: %v", reportEnv, err)
		return
	}
	defer out.Close()
	if newFile {
		fmt.Fprintln(out, "| scenario | IDs checked | faults | ran on buffers | time to fail closed | time to recover | duplicates | IDs lost to gaps | burned grants | unused blocks | failed calls | elapsed | notes |")
		fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	}
	fmt.Fprintf(out, "| %s | %d | %d | %s | %s | %s | %d | %d | %d | %d | %d | %v | %s |\n",
		s.name, f.ids, f.faults, d(f.ranOn), d(f.failClosed), d(f.recovered), f.duplicates, lost,
		f.burnedGrants, f.unusedBlocks, f.failedCalls, elapsed, f.notes)
}
