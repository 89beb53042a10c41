package monitorcheck

import (
	"slices"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`idrange_service_serving == 0`, []string{"idrange_service_serving"}},
		{`sum by (region) (rate(idrange_service_block_grants_total{job="x", region=~"$region"}[5m]))`,
			[]string{"idrange_service_block_grants_total"}},
		{`histogram_quantile(0.99, sum by (job, instance, le) (rate(a_seconds_bucket[$__rate_interval])))`,
			[]string{"a_seconds_bucket"}},
		{`a > on (job, instance) group_left 0.1 * b`, []string{"a", "b"}},
		{`a > on (job) group_left (version) b`, []string{"a", "b"}},
		{`max without (member) (x / ignoring (member) group_left y)`, []string{"x", "y"}},
		{`(x > 0) unless (y > 0) and on(job) z offset 5m`, []string{"x", "y", "z"}},
		{`region:idrange_service_free_worker_codes:max < 25.6 > 0`, []string{"region:idrange_service_free_worker_codes:max"}},
		{`min by (region) (life) < 1.5e+8 or vector(1e9)`, []string{"life"}},
		{`label_replace(m, "dst", "$1", "src", "(.*)") * on() group_left time()`, []string{"m"}},
		{`count_values("version", idrange_build_info) # a comment: not_a_metric`, []string{"idrange_build_info"}},
		{`sum(rate(x[5m:1m])) by (le) / ${scale}`, []string{"x"}},
		{`topk(5, max_over_time(g[1h])) AND BOOL h`, []string{"g", "h"}},
		{`1 - Inf + NaN`, []string{}},
	} {
		got := metricNames(tc.expr)
		if !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestHeadingAnchors(t *testing.T) {
	a := headingAnchors("# Operating rangesvc\n## Alerts and runbooks\n### Alert: IdrangeClockRollback\n```\n# not a heading\n```\n")
	for _, want := range []string{"operating-rangesvc", "alerts-and-runbooks", runbookAnchor("IdrangeClockRollback")} {
		if !a[want] {
			t.Errorf("anchor %q missing from %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Errorf("a line in a code fence was taken for a heading")
	}
}
