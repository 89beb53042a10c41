package comparerun

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idrange/idrange/internal/testing/measure"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return measure.WriteJSON(w, r) }

// WriteMarkdown writes the report as Markdown: a throughput and latency
// table (one row per strategy and goroutine count), a cost and properties
// table, and the headline ratios.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s. Started %s; %v per strategy (half at 1 goroutine, half at %d), calls of %d–%d IDs.\n\n",
		r.Machine, r.Started.Format(time.RFC3339), time.Duration(r.Duration), r.Goroutines, r.BatchMin, r.BatchMax)

	b.WriteString("| strategy | goroutines | IDs/s | × local | calls | waits | p50 / call | p99 / call | p99.9 / call | max / call |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		for i, ph := range []Phase{res.Single, res.Multi} {
			ratio := res.RatioSingle
			if i == 1 {
				ratio = res.RatioMulti
			}
			if ph.Goroutines == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %s | %s | %s | %s |\n",
				res.Name, ph.Goroutines, measure.SI(ph.IDsPerSec), ratioStr(ratio), measure.SI(float64(ph.Calls)), ph.Waits,
				measure.Latency(ph.Latency.P50), measure.Latency(ph.Latency.P99), measure.Latency(ph.Latency.P999), measure.Latency(ph.Latency.Max))
		}
	}

	b.WriteString("\n| strategy | bits | bytes/ID | network calls / 1M IDs | etcd writes / 1M IDs | wire bytes / ID | deterministic | time-ordered | max ts lead | IDs checked | duplicates |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|\n")
	for _, res := range r.Results {
		order := yesNo(res.TimeOrdered)
		if v := res.Single.OrderViolations + res.Multi.OrderViolations; v > 0 {
			order += fmt.Sprintf(" (%d out of order!)", v)
		}
		lead := max(res.Single.MaxLeadMs, res.Multi.MaxLeadMs)
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %d ms | %s | %d |\n",
			res.Name, res.Bits, res.BytesPerID, per1M(res.RPCsPer1M), per1M(res.EtcdWritesPer1M),
			fmt.Sprintf("%.3g", res.WireBytesPerID), yesNo(res.Deterministic), order, lead,
			checked(res.Verify), res.Verify.Duplicates)
	}

	b.WriteString("\n")
	local, buf, rpc := r.Result(LocalName), r.Result(BufferedName), r.Result(PerIDRPCName)
	if local != nil && buf != nil {
		fmt.Fprintf(&b, "- buffered vs local: %s IDs/s at 1 goroutine, %s at %d; p50 per call %s vs %s. At saturation the IDs/s ratio is the per-code rule, not the hot path: local waited %d times for the next millisecond, buffered ran up to %d ms ahead of the clock (see notes).\n",
			ratioStr(buf.RatioSingle), ratioStr(buf.RatioMulti), r.Goroutines, measure.Latency(buf.Single.Latency.P50), measure.Latency(local.Single.Latency.P50),
			local.Single.Waits+local.Multi.Waits, max(buf.Single.MaxLeadMs, buf.Multi.MaxLeadMs))
	}
	if buf != nil && rpc != nil && buf.Single.IDsPerSec > 0 && buf.Multi.IDsPerSec > 0 {
		fmt.Fprintf(&b, "- per-ID RPC vs buffered: %s at 1 goroutine, %s at %d (p99 per call %s vs %s).\n",
			ratioStr(rpc.Single.IDsPerSec/buf.Single.IDsPerSec), ratioStr(rpc.Multi.IDsPerSec/buf.Multi.IDsPerSec),
			r.Goroutines, measure.Latency(rpc.Single.Latency.P99), measure.Latency(buf.Single.Latency.P99))
	}
	for _, peer := range []*Result{r.Result(BwmarrinName), r.Result(SonyflakeName)} {
		if local != nil && peer != nil && peer.Single.IDsPerSec > 0 && peer.Multi.IDsPerSec > 0 {
			fmt.Fprintf(&b, "- %s vs local: %s at 1 goroutine, %s at %d; p50 per call %s vs %s, p99 %s vs %s.\n",
				peer.Name, ratioStr(peer.RatioSingle), ratioStr(peer.RatioMulti), r.Goroutines,
				measure.Latency(peer.Single.Latency.P50), measure.Latency(local.Single.Latency.P50),
				measure.Latency(peer.Single.Latency.P99), measure.Latency(local.Single.Latency.P99))
		}
	}
	b.WriteString(`
Notes:
- Latency is per call (1 call = k IDs) as the caller sees it, harness included (two clock readings and a histogram record per call).
- waits: for local, calls that found all 4,096 sequences of the millisecond used and waited (spinning on the clock) for the next one; bwmarrin busy-waits and sonyflake sleeps in the same case, uncounted. One code mints at most 4,096 IDs/ms (4.096M/s); a tight loop reaches that, so local is capped below it.
- buffered can exceed 4.096M/s per code for a while: its cursor runs ahead of the clock inside blocks it already holds (max ts lead). The service bounds the lead (MaxLead, 15 s), after which grants are refused with backpressure, so its sustained ceiling per code is the same 4.096M/s.
- Caps per code: local, buffered and bwmarrin mint at most 4,096 IDs/ms (4.096M/s) per worker code or node (12-bit sequence per millisecond); sonyflake at most 256 per 10 ms unit, 25,600 IDs/s per machine ID (8-bit sequence, 10 ms time unit), so one sonyflake instance is capped far below the others and its calls wait up to 10 ms once it saturates; per-id-rpc is bounded by one round trip per ID; uuidv7 has no cap (random bits, not deterministic). More throughput than one code's cap takes more codes (instances), each with its own worker, node or machine ID.
- bwmarrin and sonyflake run as they ship (their own epochs and layouts, a static node / machine ID); their IDs are checked for uniqueness and their timestamps (decoded by the library) for range. Neither persists a clock ceiling: a restart with the clock set back can repeat IDs, which local's high-water mark and the service's leases rule out.
- etcd writes are counted at the store: successful block grants, lease acquisitions and releases. network calls are counted by a client interceptor (lease renewals included).
`)
	for _, res := range r.Results {
		if res.Error != "" {
			fmt.Fprintf(&b, "- %s FAILED: %s\n", res.Name, res.Error)
		}
		if res.Verify.Problem != "" {
			fmt.Fprintf(&b, "- %s VERIFY FAILED: %s\n", res.Name, res.Verify.Problem)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ratioStr(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v >= 10:
		return fmt.Sprintf("%.0f×", v)
	case v >= 0.1:
		return fmt.Sprintf("%.2f×", v)
	case v >= 0.001:
		return fmt.Sprintf("%.4f×", v)
	}
	return fmt.Sprintf("1/%.0f", 1/v)
}

func per1M(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func checked(v Verify) string {
	if v.Checked == v.Minted {
		return fmt.Sprintf("%s (all)", measure.SI(float64(v.Checked)))
	}
	return fmt.Sprintf("%s of %s", measure.SI(float64(v.Checked)), measure.SI(float64(v.Minted)))
}
