package compare_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/compare"
	"github.com/idrange/idrange/internal/testing/measure"
)

// The strategies that need no service run through the public API in well
// under a second, starting no region: results in the order asked, positive
// rates, every ID verified, and headline fields that agree with the full
// JSON, which decodes back into them.
func TestRunLocalStrategies(t *testing.T) {
	var progress bytes.Buffer
	rep, err := compare.Run(context.Background(), compare.Config{
		Strategies: []string{"local", "uuidv7"}, Duration: 100 * time.Millisecond, Goroutines: 2, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("report error: %v", err)
	}
	if len(rep.Results) != 2 || rep.Results[0].Name != "local" || rep.Results[1].Name != "uuidv7" {
		t.Fatalf("results %+v", rep.Results)
	}
	for _, r := range rep.Results {
		if r.Single.IDsPerSec <= 0 || r.Multi.IDsPerSec <= 0 {
			t.Errorf("%s: IDs/s %v and %v, want positive", r.Name, r.Single.IDsPerSec, r.Multi.IDsPerSec)
		}
	}
	// Every ID verified: the full report's check of each strategy covers
	// every ID it minted (100 ms mint far fewer than the cap on kept IDs),
	// none duplicate or out of range.
	var full struct {
		Results []struct {
			Name   string
			Verify struct {
				Checked    int64  `json:"checked"`
				Minted     int64  `json:"minted"`
				Duplicates int64  `json:"duplicates"`
				OutOfRange int64  `json:"out_of_range"`
				Problem    string `json:"problem"`
			}
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js.Bytes(), &full); err != nil || len(full.Results) != 2 {
		t.Fatalf("the full report: %v, %d results", err, len(full.Results))
	}
	for _, r := range full.Results {
		if v := r.Verify; v.Checked <= 0 || v.Checked != v.Minted || v.Duplicates != 0 || v.OutOfRange != 0 || v.Problem != "" {
			t.Errorf("%s: verify %+v; want every minted ID checked, all unique and in range", r.Name, v)
		}
	}
	back := measure.RoundTrip[compare.Report](t, rep.WriteJSON)
	if len(back.Results) != 2 || back.Results[0] != rep.Results[0] || back.Results[1] != rep.Results[1] {
		t.Errorf("decoded %+v, the report's %+v", back.Results, rep.Results)
	}
	if strings.Contains(progress.String(), "in-process region") {
		t.Error("started a region no strategy needs")
	}
	if err := back.Err(); err == nil {
		t.Error("Err of a decoded report is nil, want an error saying it has no full report")
	}
}

// An unknown strategy name is refused, naming it and the known ones.
func TestRunRefusesUnknownStrategy(t *testing.T) {
	_, err := compare.Run(context.Background(), compare.Config{Strategies: []string{"local", "carrier-pigeon"}})
	if err == nil || !strings.Contains(err.Error(), `"carrier-pigeon"`) || !strings.Contains(err.Error(), "sonyflake") {
		t.Fatalf("Run = %v, want an error naming the strategy and the known ones", err)
	}
}
