package bench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/bench"
	"github.com/idrange/idrange/internal/testing/measure"
)

// The smallest fleet runs through the public API: every ID verified, the
// headline fields agree with the full JSON (which decodes back into them),
// and a decoded report, having no full report behind it, says so. The
// engine's own tests (internal/testing/benchrun) cover the figures.
func TestRunSmallFleet(t *testing.T) {
	rep, err := bench.Run(context.Background(), bench.Config{Regions: 1, Workers: 2, Rate: 2000, Duration: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil || rep.IDs <= 0 {
		t.Fatalf("report error %v, %d IDs", err, rep.IDs)
	}
	back := measure.RoundTrip[bench.Report](t, rep.WriteJSON)
	if back.IDs != rep.IDs || back.AchievedRate != rep.AchievedRate || back.TargetReached != rep.TargetReached {
		t.Errorf("decoded headline %+v, the report's %+v", back, *rep)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "verification (every ID) | PASS") {
		t.Errorf("markdown (%v):\n%s", err, md.String())
	}
	if err := back.WriteMarkdown(&md); err == nil || !strings.Contains(err.Error(), "did not come from Run") {
		t.Errorf("WriteMarkdown of a decoded report: %v, want an error saying it has no full report", err)
	}
}

// A bad Config is refused with a one-line error naming the field, before
// anything starts.
func TestRunRefusesBadConfig(t *testing.T) {
	_, err := bench.Run(context.Background(), bench.Config{Regions: 5})
	if err == nil || !strings.Contains(err.Error(), "Regions 5") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Run(Regions: 5) = %v, want a one-line error naming Regions", err)
	}
}
