package monitorcheck

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/idrange/idrange/internal/server/buildinfo"
	"github.com/idrange/idrange/internal/server/etcdspace"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/rangeclient"
)

// exportTimeout bounds the wait for series that background loops create
// (free worker codes, etcd backend sizes) to appear in a scrape.
const exportTimeout = 20 * time.Second

// usedNames returns every metric name the rules and the dashboard use,
// each with where it is used, and the recording rules' output names.
func usedNames(t *testing.T) (used map[string][]string, recorded map[string]bool) {
	t.Helper()
	used, recorded = map[string][]string{}, map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	for where, expr := range queries(t) {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		for _, n := range names {
			used[n] = append(used[n], where)
		}
	}
	return used, recorded
}

// servingGatherer stands up what exports idrange's metrics: an in-process
// rangesvc replica (internal/server/region, the construction `rangesvc serve`
// runs: service, store and etcd space metrics), the history compactor
// (off in in-process regions), the collectors `rangesvc serve` adds (Go,
// process, build info), and a rangeclient with its metrics registered,
// holding a lease from that replica; and a replica built with a registry
// (--registry-etcd), whose metrics exist only then.
func servingGatherer(t *testing.T) []prometheus.Gatherer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), exportTimeout)
	defer cancel()
	r := regiontest.Start(t, localregion.Config{Region: 1})

	serveReg := prometheus.NewRegistry()
	serveReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.NewCollector(buildinfo.Read()))
	if _, err := etcdspace.NewCompactor(etcdspace.CompactorConfig{Etcd: r.Client(), Key: "monitorcheck/compactor",
		Registerer: serveReg}); err != nil {
		t.Fatal(err)
	}

	// The registry metrics exist only with --registry-etcd: a second
	// replica, built (not served) with a registry, exports them.
	withRegistry := prometheus.NewRegistry()
	if _, err := region.NewReplica(region.ReplicaConfig{Region: 1, Etcd: r.Client(), RegistryEtcd: r.Client(),
		Registry: withRegistry}); err != nil {
		t.Fatal(err)
	}

	clientReg := prometheus.NewRegistry()
	c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{r.Addr()}, Region: 1, Registerer: clientReg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Next(ctx); err != nil {
		t.Fatal(err)
	}
	return []prometheus.Gatherer{r.Registry(), serveReg, withRegistry, clientReg}
}

// exportedNames returns the series names a scrape of gs shows: each
// family's name, and for histograms and summaries the _bucket, _sum and
// _count series. (Gathered one by one: the two replicas export the same
// series, which one merged scrape would refuse.)
func exportedNames(t *testing.T, gs []prometheus.Gatherer) map[string]bool {
	t.Helper()
	var mfs []*dto.MetricFamily
	for _, g := range gs {
		m, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		mfs = append(mfs, m...)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		out[mf.GetName()] = true
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[mf.GetName()+"_bucket"] = true
			fallthrough
		case dto.MetricType_SUMMARY:
			out[mf.GetName()+"_sum"] = true
			out[mf.GetName()+"_count"] = true
		}
	}
	return out
}

// missingNames returns the used names that are neither exported nor
// recorded, each with where it is used, sorted.
func missingNames(used map[string][]string, exported, recorded map[string]bool) []string {
	var out []string
	for n, where := range used {
		if !exported[n] && !recorded[n] {
			out = append(out, n+" (used in "+strings.Join(where, "; ")+")")
		}
	}
	sort.Strings(out)
	return out
}

// Every metric name a rule or a dashboard panel uses is exported by the
// real registries (or is a recording rule's output), so renaming a metric
// in the code fails here instead of silencing an alert.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	used, recorded := usedNames(t)
	// The checker sees the names it must: a sample of each source.
	for _, n := range []string{"idrange_service_clock_rollback_ms", "idrange_client_safety_deadline_expiries_total",
		"idrange_etcd_quota_bytes", "idrange_service_block_grant_latency_seconds_bucket"} {
		if used[n] == nil {
			t.Errorf("no rule or panel uses %s; the name extraction is broken", n)
		}
	}
	g := servingGatherer(t)
	var missing []string
	deadline := time.Now().Add(exportTimeout)
	for {
		// Some series appear only once the replica's background loops have
		// run once; poll until every name is seen or the time is up.
		missing = missingNames(used, exportedNames(t, g), recorded)
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range missing {
		t.Errorf("metric not exported by rangesvc or rangeclient: %s", m)
	}
	if len(missing) == 0 {
		t.Logf("%d metric names used, all exported or recorded", len(used))
	}
	// The scales the latency and lead alerts compare against are set by a
	// real replica (a 0 would make IdrangeGrantLatencyHigh fire on any grant).
	mfs, err := g[0].Gather() // the served replica
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"idrange_service_lease_ttl_seconds", "idrange_service_max_lead_seconds"} {
		i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == name })
		if i < 0 || len(mfs[i].GetMetric()) == 0 || mfs[i].GetMetric()[0].GetGauge().GetValue() <= 0 {
			t.Errorf("%s is not set to a positive value by the replica", name)
		}
	}
}

// A name that the code stops exporting (renamed, removed) is reported,
// with where it is used.
func TestMissingNamesReportsUnexported(t *testing.T) {
	used := map[string][]string{
		"idrange_service_serving":             {"a rule"},
		"idrange_service_serving_renamed":     {"a panel"},
		"region:idrange_service_serving:sum":  {"an alert"},
		"idrange_service_grant_latency_count": {"a panel"},
	}
	exported := map[string]bool{"idrange_service_serving": true, "idrange_service_grant_latency_count": true}
	recorded := map[string]bool{"region:idrange_service_serving:sum": true}
	got := missingNames(used, exported, recorded)
	want := []string{"idrange_service_serving_renamed (used in a panel)"}
	if !slices.Equal(got, want) {
		t.Errorf("missingNames = %q, want %q", got, want)
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
