package monitorcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/segment"
)

// Issue 24: the alert fires on what a real replica exports when a code's
// high-water mark goes back, not only on the synthetic series of the rules'
// unit tests. A replica grants on a code, an etcd client lowers the code's
// mark behind its back, the next grant is refused; the replica's scrape
// before and after becomes promtool's input series (with the job and
// instance a scrape adds), and the alert's own expression must select that
// replica after the refusal and nothing before it.
func TestHighWaterRegressedAlertFiresOnARealReplica(t *testing.T) {
	promtool := lookPromtool(t)
	const alert = "IdrangeHighWaterMarkRegressed"
	rule, ok := alerts(t, loadRules(t))[alert]
	if !ok {
		t.Fatalf("%s defines no %s", rulesFile, alert)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := regiontest.Start(t, localregion.Config{Region: 1})
	before := scrapeSeries(t, r, "idrange_service_hwm_regressions_total", "idrange_service_hwm_regressed_codes")

	st := r.Store()
	l, err := st.Acquire(ctx, 1, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	op, err := r.Etcd().NewClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	stg, err := etcdstore.New(op, etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Put(ctx, stg.HighWaterKey(1, l.Worker), store.EncodeHighWater(b.Lo)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrHighWaterRegressed) {
		t.Fatalf("grant after lowering the mark: %v, want ErrHighWaterRegressed", err)
	}
	after := scrapeSeries(t, r, "idrange_service_hwm_regressions_total", "idrange_service_hwm_regressed_codes")

	// Four scrapes before the refusal, twenty after, 30 s apart.
	var in strings.Builder
	for _, s := range slices.Sorted(maps.Keys(after)) {
		fmt.Fprintf(&in, "      - series: '%s'\n        values: '%gx3 %gx20'\n", s, before[s], after[s])
	}
	selects := fmt.Sprintf("count by (job, instance, region) (%s)", strings.Join(strings.Fields(rule.Expr), " "))
	test := fmt.Sprintf(`rule_files: []
evaluation_interval: 30s
tests:
  - interval: 30s
    input_series:
%s    promql_expr_test:
      - expr: %q
        eval_time: 1m
        exp_samples: []
      - expr: %q
        eval_time: 5m
        exp_samples:
          - labels: '{instance="replica", job="rangesvc", region="1"}'
            value: 1
`, in.String(), selects, selects)
	path := filepath.Join(t.TempDir(), "real-replica.test.yml")
	if err := os.WriteFile(path, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("%s's expression on the replica's own series: %v\n%s\n%s", alert, err, out, test)
	}
	t.Logf("series scraped from the replica:\n%s", in.String())
}

// scrapeSeries gathers r's registry and returns each sample of the named
// families as a series selector with the job and instance labels a scrape
// adds, mapped to its value.
func scrapeSeries(t *testing.T, r *localregion.Region, names ...string) map[string]float64 {
	t.Helper()
	mfs, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := []string{`job="rangesvc"`, `instance="replica"`}
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			sort.Strings(labels)
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = value(m)
		}
	}
	for _, n := range names {
		found := false
		for s := range out {
			found = found || strings.HasPrefix(s, n+"{")
		}
		if !found {
			t.Fatalf("the replica exports no %s", n)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}
