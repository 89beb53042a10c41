package monitorcheck

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	// Prometheus's own PromQL parser, in test code only: the shipped
	// binaries do not link Prometheus (internal/tools/depcheck checks).
	"github.com/prometheus/prometheus/promql/parser"
)

// queries returns every PromQL expression of the monitoring files, keyed by
// where it is: each rule of the rules file (alerting and recording), each
// panel query of the dashboard and each query variable, Grafana's variables
// replaced by what they stand for (grafanaToPromQL).
func queries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for i, r := range g.Rules {
			out[fmt.Sprintf("%s group %q rule %d (%s)", rulesFile, g.Name, i+1, r.Record+r.Alert)] = r.Expr
		}
	}
	d, err := readDashboard(filepath.Join(repoRoot(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	for where, expr := range d.exprs() {
		out[dashboardFile+" "+where] = grafanaToPromQL(expr)
	}
	for name, expr := range d.variableExprs() {
		out[dashboardFile+" variable "+name] = grafanaToPromQL(expr)
	}
	return out
}

// checkPromQL parses expr with Prometheus's parser and checks that it
// yields what a rule or a dashboard graph can use: an instant vector or a
// scalar (a range vector such as x[5m] parses, but fails every
// evaluation).
func checkPromQL(expr string) error {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return err
	}
	if typ := e.Type(); typ != parser.ValueTypeVector && typ != parser.ValueTypeScalar {
		return &typeError{typ}
	}
	return nil
}

type typeError struct{ typ parser.ValueType }

func (e *typeError) Error() string {
	return "the expression is a " + string(e.typ) + "; a rule or a graph needs an instant vector or a scalar"
}

// Every rule expression and dashboard query is valid PromQL by Prometheus's
// own parser, and of a type a rule or graph can evaluate: the syntax is
// checked on every run, with or without promtool (TestPromtool adds
// promtool's template checks and the rules' unit tests).
func TestPromQLParses(t *testing.T) {
	qs := queries(t)
	var rules, dashboard int
	for where, expr := range qs {
		if strings.HasPrefix(where, rulesFile) {
			rules++
		} else {
			dashboard++
		}
		if err := checkPromQL(expr); err != nil {
			t.Errorf("%s: %v\n  %s", where, err, expr)
		}
	}
	// The walk reaches both files (an empty walk would pass).
	if rules < 10 || dashboard < 20 {
		t.Errorf("%d rule expressions and %d dashboard queries found; the walk is broken", rules, dashboard)
	}
}

// The check refuses what it must: a syntax error, an unknown function, a
// range vector, a Grafana variable left where a number belongs.
func TestCheckPromQLRefuses(t *testing.T) {
	for _, expr := range []string{
		`sum(rate(x[5m])`,
		`rate(x[5m]) >`,
		`no_such_function(x)`,
		`x[5m]`,
		`histogram_quantile($q, x)`,
		`x{job="a"`,
	} {
		if err := checkPromQL(expr); err == nil {
			t.Errorf("checkPromQL(%q) = nil, want an error", expr)
		}
	}
	for _, expr := range []string{`up`, `1`, `sum by (job) (rate(x[5m])) > 0.5`, grafanaToPromQL(`rate(x{region=~"$region"}[$__rate_interval])`)} {
		if err := checkPromQL(expr); err != nil {
			t.Errorf("checkPromQL(%q): %v", expr, err)
		}
	}
}
