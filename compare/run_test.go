package compare_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/compare"
)

// The strategies that need no service run through the public API in well
// under a second: results in the order asked, the headline fields agree
// with the full JSON, and every ID verified.
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
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back compare.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	if len(back.Results) != 2 || back.Results[1] != rep.Results[1] {
		t.Errorf("decoded %+v, report %+v", back.Results, rep.Results)
	}
	if strings.Contains(progress.String(), "in-process region") {
		t.Error("started a region no strategy needs")
	}
	if err := back.Err(); err == nil {
		t.Error("Err of a decoded report is nil, want an error saying it has no detail")
	}
}

// An unknown strategy name is refused, naming it and the known ones.
func TestRunRefusesUnknownStrategy(t *testing.T) {
	_, err := compare.Run(context.Background(), compare.Config{Strategies: []string{"local", "carrier-pigeon"}})
	if err == nil || !strings.Contains(err.Error(), `"carrier-pigeon"`) || !strings.Contains(err.Error(), "sonyflake") {
		t.Fatalf("Run = %v, want an error naming the strategy and the known ones", err)
	}
}
