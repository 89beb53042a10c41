package monitorcheck

import (
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// metricNames returns the metric names expr selects, sorted and without
// duplicates, from Prometheus's parse of it (a selector's name, or its
// __name__="..." matcher). Grafana's variables must be replaced first
// (grafanaToPromQL).
func metricNames(expr string) ([]string, error) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if name == "" && m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name != "" {
			seen[name] = true
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

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
		{`sum(rate(x[5m:1m])) by (le) / scalar(y)`, []string{"x", "y"}},
		{`topk(5, max_over_time(g[1h])) > BOOL h`, []string{"g", "h"}},
		{`{__name__="by_matcher", job="a"}`, []string{"by_matcher"}},
		{`1 - Inf + NaN`, []string{}},
	} {
		got, err := metricNames(grafanaToPromQL(tc.expr))
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
	if _, err := metricNames(`sum(x`); err == nil {
		t.Errorf("metricNames of an expression that does not parse: no error")
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
