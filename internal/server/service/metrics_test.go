package service

import (
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idrange/idrange/segment"
)

// The lease TTL and MaxLead gauges are the scales the alert rules in
// deploy/prometheus measure grant latency and HWM lead against: they export
// the store's configuration with its defaults applied.
func TestSetStoreConfigExportsPolicy(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.LeaseTTL); got != 0 {
		t.Fatalf("lease_ttl_seconds before SetStoreConfig = %v, want 0", got)
	}
	m.SetStoreConfig(store.Config{LeaseTTL: 3 * time.Second,
		Policy: segment.Policy{MaxLead: 1500 * time.Millisecond}})
	for name, want := range map[string]float64{
		"idrange_service_lease_ttl_seconds": 3,
		"idrange_service_max_lead_seconds":  1.5,
	} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == name {
				found = true
				if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
		}
		if !found {
			t.Errorf("%s not registered", name)
		}
	}
}

// The store's regression events become the counter the alert fires on and
// the gauge of codes refused now, labelled by region; a recovery lowers
// only the gauge.
func TestStoreObserverCountsRegressions(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.initRegion(2)
	obs := m.StoreObserver()
	check := func(when string, total, refused float64) {
		t.Helper()
		if got := testutil.ToFloat64(m.HWMRegressions.WithLabelValues("2")); got != total {
			t.Errorf("%s: hwm_regressions_total = %v, want %v", when, got, total)
		}
		if got := testutil.ToFloat64(m.HWMRegressedCodes.WithLabelValues("2")); got != refused {
			t.Errorf("%s: hwm_regressed_codes = %v, want %v", when, got, refused)
		}
	}
	check("before any event", 0, 0)
	obs.HighWaterRegressed(2, 7, 5000, 4096)
	obs.HighWaterRegressed(2, 9, 8000, 0)
	check("two codes went back", 2, 2)
	obs.HighWaterRecovered(2, 7)
	check("one lifted again", 2, 1)
	if got := testutil.ToFloat64(m.CorruptValues); got != 0 {
		t.Errorf("corrupt_values_total = %v; a regression is counted apart", got)
	}
}
