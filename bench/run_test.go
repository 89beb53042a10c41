package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/bench"
)

// The smallest fleet runs through the public API: the headline fields
// agree with the full JSON, which decodes back into them, and every ID
// verified. (The engine's own tests, in internal/testing/benchrun, cover
// the figures.)
func TestRunSmallFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and a fleet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := bench.Run(ctx, bench.Config{Regions: 1, Workers: 2, Rate: 2000, Duration: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("report error: %v", err)
	}
	var js, md bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	if back.IDs != rep.IDs || back.AchievedRate != rep.AchievedRate || back.TargetReached != rep.TargetReached || rep.IDs <= 0 {
		t.Errorf("decoded headline %+v, report's %+v", back, *rep)
	}
	if err := rep.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "verification (every ID) | PASS") {
		t.Errorf("markdown (%v):\n%s", err, md.String())
	}
	// A decoded report has its fields only: its methods say so.
	if err := back.Err(); err == nil {
		t.Error("Err of a decoded report is nil, want an error saying it has no detail")
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
