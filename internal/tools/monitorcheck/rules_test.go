package monitorcheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/tools/promrule"
)

// promtoolHint says how to get promtool when a test lacks it.
const promtoolHint = "install it with `apt-get install prometheus` (Debian; .ci/run does) to run the rule checks"

// loadRules reads the rules file with the parser the PrometheusRule
// generator uses (promrule.Parse: strict decoding and the structure checks
// Prometheus applies; it does not parse PromQL, TestPromQLParses does).
func loadRules(t *testing.T) promrule.RulesFile {
	t.Helper()
	path := filepath.Join(repoRoot(), rulesFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rf, err := promrule.Parse(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rf
}

// alerts returns the alerting rules of rf by name; duplicates are errors.
func alerts(t *testing.T, rf promrule.RulesFile) map[string]promrule.Rule {
	t.Helper()
	out := map[string]promrule.Rule{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if _, dup := out[r.Alert]; dup {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			out[r.Alert] = r
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no alerting rule", rulesFile)
	}
	return out
}

var alertName = regexp.MustCompile(`^Idrange[A-Z][A-Za-z0-9]*$`)

// Every alert has a severity an Alertmanager route can match, a summary, a
// description saying what to do, and a runbook link to its own section of
// docs/operations/alerts.md.
func TestAlertsHaveSeveritySummaryAndRunbook(t *testing.T) {
	rf := loadRules(t)
	doc, err := os.ReadFile(filepath.Join(repoRoot(), runbookFile))
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(doc))
	for name, r := range alerts(t, rf) {
		if !alertName.MatchString(name) {
			t.Errorf("alert %q: want a CamelCase name starting with Idrange", name)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("alert %s: labels.severity %q, want warning or critical", name, s)
		}
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[k]) == "" {
				t.Errorf("alert %s: annotations.%s is missing", name, k)
			}
		}
		anchor := runbookAnchor(name)
		if want := runbookFile + "#" + anchor; !strings.HasSuffix(r.Annotations["runbook_url"], want) {
			t.Errorf("alert %s: runbook_url %q does not end in %s", name, r.Annotations["runbook_url"], want)
		}
		if !anchors[anchor] {
			t.Errorf("alert %s: %s has no heading \"Alert: %s\" (anchor #%s)", name, runbookFile, name, anchor)
		}
	}
}

// Every alert has a promtool test case that expects it to fire, so that
// deleting an alert's test fails here even though promtool, which only runs
// the cases that exist, would pass; and every case names an alert that
// exists.
func TestEveryAlertHasAFiringTestCase(t *testing.T) {
	as := alerts(t, loadRules(t))
	var tf ruleTestFile
	if err := readYAML(filepath.Join(repoRoot(), rulesTestFile), &tf); err != nil {
		t.Fatal(err)
	}
	if len(tf.RuleFiles) != 1 || tf.RuleFiles[0] != filepath.Base(rulesFile) {
		t.Errorf("%s: rule_files %v, want [%s]", rulesTestFile, tf.RuleFiles, filepath.Base(rulesFile))
	}
	fires := map[string]bool{}
	for _, tc := range tf.Tests {
		for _, at := range tc.AlertRuleTest {
			if _, ok := as[at.AlertName]; !ok {
				t.Errorf("%s: test %q checks alert %q, which %s does not define", rulesTestFile, tc.Name, at.AlertName, rulesFile)
			}
			if len(at.ExpAlerts) > 0 {
				fires[at.AlertName] = true
			}
		}
	}
	for name := range as {
		if !fires[name] {
			t.Errorf("alert %s has no test case in %s that expects it to fire", name, rulesTestFile)
		}
	}
}

// promtool checks the rules (syntax, templates) and runs their unit tests.
func TestPromtool(t *testing.T) {
	promtool := lookPromtool(t)
	dir := filepath.Join(repoRoot(), filepath.Dir(rulesFile))
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(rulesFile)},
		{"test", "rules", filepath.Base(rulesTestFile)},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func lookPromtool(t *testing.T) string {
	t.Helper()
	return testenv.LookTool(t, "promtool", promtoolHint)
}

// The dashboard's queries are valid PromQL: promtool checks them as the
// expressions of recording rules, with Grafana's variables replaced by
// what they stand for.
func TestDashboardQueriesParse(t *testing.T) {
	promtool := lookPromtool(t)
	d, err := readDashboard(filepath.Join(repoRoot(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, where := range sortedKeys(d.exprs()) {
		n++
		fmt.Fprintf(&b, "      - record: dashboard:query_%d # %s\n        expr: %q\n", n, where, grafanaToPromQL(d.exprs()[where]))
	}
	for _, v := range sortedKeys(d.variableExprs()) {
		n++
		fmt.Fprintf(&b, "      - record: dashboard:variable_%d # %s\n        expr: %q\n", n, v, grafanaToPromQL(d.variableExprs()[v]))
	}
	path := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s\n%s", err, out, b.String())
	}
}

// grafanaToPromQL replaces Grafana's variables with values of the kind
// they stand for: intervals with 5m, anything else (label regexps) with .*.
func grafanaToPromQL(expr string) string {
	r := strings.NewReplacer("$__rate_interval", "5m", "${__rate_interval}", "5m",
		"$__interval", "1m", "${__interval}", "1m", "$__range", "1h", "${__range}", "1h")
	expr = r.Replace(expr)
	return regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(expr, ".*")
}
