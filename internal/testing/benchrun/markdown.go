package benchrun

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/idrange/idrange/internal/testing/measure"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return measure.WriteJSON(w, r) }

// WriteJSON writes the sweep as indented JSON.
func (s *SweepReport) WriteJSON(w io.Writer) error { return measure.WriteJSON(w, s) }

// WriteMarkdown writes the report as a two-column Markdown table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	f := r.Fleet
	fmt.Fprintf(&b, "Machine: %s. Started %s.\n\n", r.Machine, r.Started.Format(time.RFC3339))
	fmt.Fprintf(&b, "Fleet: %d region(s) × %d workers = %d rangeclients over loopback gRPC, %s; target %s IDs/s (%.0f per worker, tick %v), %v",
		f.Regions, f.Workers, f.Regions*f.Workers, f.Etcd, measure.SI(f.TargetRate), f.PerWorkerRate, time.Duration(f.Tick), time.Duration(f.Duration))
	if f.FixedBlock > 0 {
		fmt.Fprintf(&b, ", fixed block %d units (%s of span)", f.FixedBlock, spanString(f.FixedBlock))
	} else {
		fmt.Fprintf(&b, ", adaptive blocks (refill interval %v)", time.Duration(f.RefillInterval))
	}
	if f.SharedConns > 0 {
		fmt.Fprintf(&b, "; many-clients mode: per region %d workers with a code each and %d with Codes 0 (shared path) over %d shared connections, shared-path bound %s IDs/s",
			f.Dedicated, f.Workers-f.Dedicated, f.SharedConns, measure.SI(f.SharedRate))
	}
	if f.CPUHog > 0 {
		fmt.Fprintf(&b, "; CPU hog: %d busy core(s) in a child process during the run (it burnt %.2f cores)", f.CPUHog, r.HogCPUCores)
	} else {
		b.WriteString("; no CPU hog")
	}
	b.WriteString(".\n\n| measure | value |\n|---|---|\n")
	row := func(k, format string, args ...any) { fmt.Fprintf(&b, "| %s | %s |\n", k, fmt.Sprintf(format, args...)) }
	reached := "target reached"
	if !r.TargetReached {
		reached = "**target NOT reached on this machine**"
	}
	el := time.Duration(r.Elapsed).Seconds()
	row("achieved rate (paced IDs returned within the window / window)", "%s IDs/s (%.1f%% of %s; %s)", measure.SI(r.AchievedRate), 100*r.AchievedRate/f.TargetRate, measure.SI(f.TargetRate), reached)
	row("schedule kept", "%.2f%% of the %.0f IDs owed by the end; the last worker finished %v after the end",
		100*r.ScheduleKept, f.TargetRate*time.Duration(f.Duration).Seconds(), (time.Duration(r.Elapsed) - time.Duration(f.Duration)).Round(time.Millisecond))
	row("IDs minted", "%d in %v (%d of them in bursts; %s IDs/s in all)", r.IDs, time.Duration(r.Elapsed).Round(time.Millisecond), r.BurstIDs, measure.SI(r.TotalRate))
	row("CPU used by this process", "%.2f cores (of %d; the host's load average was %s at start)", r.CPUCores, r.Machine.NumCPU, r.Machine.LoadAvg)
	if len(r.CPUByRole) > 0 {
		var parts []string
		for _, role := range []string{"replica", "etcd", "client", "pacer", "other"} {
			parts = append(parts, fmt.Sprintf("%s %.2f", role, r.CPUByRole[role]))
		}
		row("CPU by part (sampled; replica = the range service, pacer = the load generator)", "%s cores", strings.Join(parts, " · "))
	}
	if r.HogProblem != "" {
		row("CPU hog", "**%s**", r.HogProblem)
	}
	row("latency per ID", "p50 %s · p99 %s · p99.9 %s · max %s", measure.Latency(r.Latency.P50), measure.Latency(r.Latency.P99), measure.Latency(r.Latency.P999), measure.Latency(r.Latency.Max))
	row("tick lateness (machine keeping up?)", "p50 %s · p99 %s · max %s", measure.Latency(r.TickLateness.P50), measure.Latency(r.TickLateness.P99), measure.Latency(r.TickLateness.Max))
	if r.Burst.Size > 0 {
		row(fmt.Sprintf("burst: %d IDs back to back, one worker", r.Burst.Size), "%d bursts, %d within 1 ms; duration p50 %s · max %s; per ID p99.9 %s",
			r.Burst.Count, r.Burst.WithinBudget, measure.Latency(r.Burst.Duration.P50), measure.Latency(r.Burst.Duration.Max), measure.Latency(r.Burst.Latency.P999))
	}
	row("refills (blocks granted to clients)", "%d (%.0f/s); refill errors %d; backpressure %d", r.Refills, float64(r.Refills)/el, r.RefillErrors, r.Backpressure)
	row("stalls (Next waited for a block)", "%d", r.Stalls)
	row("Next calls slower than 1 ms", "%d of %d (%.4f%%)", r.SlowCalls, r.IDs, 100*float64(r.SlowCalls)/float64(max(r.IDs, 1)))
	row("etcd writes", "%d (%.0f/s): %d grants, %d lease acquisitions, %d releases; %d HWM races retried",
		r.EtcdWrites, r.EtcdWritesPerSec, r.Store.Grants, r.Store.Acquires, r.Store.Releases, r.Store.Conflicts)
	row("etcd Txns (raft proposals; grants of several codes share one)", "%d (%.0f/s; %.0f per 1M IDs)",
		r.Store.Txns, r.EtcdTxnsPerSec, float64(r.Store.Txns)*1e6/float64(max(r.IDs, 1)))
	if f.SharedConns > 0 {
		calls := r.ServerLatency[sharedMethod].Count + r.ServerLatency[sharedBatchMethod].Count
		row("shared path (runs granted)", "%d (%.0f/s) in %d calls (%.1f runs a call); %d clients on it at the end, %d took a code of their own",
			r.SharedGrants, float64(r.SharedGrants)/el, calls, float64(r.SharedGrants)/float64(max(calls, 1)), r.SharedClients, r.SharedTookCode)
	}
	row("lease renewals (keep-alives, not writes)", "%d", r.Store.Renewals)
	methods := make([]string, 0, len(r.ServerLatency))
	for m := range r.ServerLatency {
		methods = append(methods, m)
	}
	sort.Strings(methods)
	for _, m := range methods {
		l := r.ServerLatency[m]
		row("service time of "+m, "%d calls · p50 %s · p99 %s · p99.9 %s · max %s", l.Count, measure.Latency(l.P50), measure.Latency(l.P99), measure.Latency(l.P999), measure.Latency(l.Max))
		if l, ok := r.GrantLatency[m]; ok {
			row("round trip of "+m+" (Codes-0 workers, shared connections)", "%d calls · p50 %s · p99 %s · p99.9 %s · max %s",
				l.Count, measure.Latency(l.P50), measure.Latency(l.P99), measure.Latency(l.P999), measure.Latency(l.Max))
		}
	}
	row("failed Next calls", "%d%s", r.Errors, firstErr(r.FirstError))
	row("leases replaced (lost, then re-acquired)", "%d", r.LeaseChanges)
	row("setup (leases + first blocks)", "%v, %d client start(s) retried", time.Duration(r.SetupTime).Round(time.Millisecond), r.SetupRetries)
	v := r.Verify
	status := "PASS"
	if v.Problem != "" {
		status = "**FAIL**: " + v.Problem
	}
	if v.IdleSharedWorkers > 0 {
		row("Codes-0 workers that minted nothing", "%d", v.IdleSharedWorkers)
	}
	if len(v.MissingCodes) > 0 {
		row("workers whose first code minted nothing", "%d (starved before their first ID, or lost the lease first)", len(v.MissingCodes))
	}
	row("verification (every ID)", "%s: %d checked, %d unique, %d duplicates, %d out of range, %d codes minted, in %v",
		status, v.Checked, v.Unique, v.Duplicates, v.OutOfRange, v.Codes, time.Duration(r.VerifyTime).Round(time.Millisecond))
	_, err := io.WriteString(w, b.String())
	return err
}

func firstErr(s string) string {
	if s == "" {
		return ""
	}
	return " (first: " + oneLine(s) + ")"
}
