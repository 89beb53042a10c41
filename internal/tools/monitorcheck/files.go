package monitorcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/tools/doclinks"
	"sigs.k8s.io/yaml"
)

// The files checked, relative to the repository root.
const (
	rulesFile     = "deploy/prometheus/idrange.rules.yml"
	rulesTestFile = "deploy/prometheus/idrange.rules.test.yml"
	dashboardFile = "deploy/grafana/idrange.json"
	runbookFile   = "docs/operations/alerts.md"
)

// repoRoot is the repository root: three levels above this source file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// ruleTestFile is a promtool unit-test file (the fields the checks read).
type ruleTestFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			AlertName string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `json:"exp_labels"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// readYAML decodes the YAML file at path into v (the rules file itself is
// read by promrule.Parse, strictly).
func readYAML(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		return errors.Newf("%s: %w", path, err)
	}
	return nil
}

// dashboard is a Grafana dashboard (the fields the checks read).
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"` // a collapsed row's panels
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

func readDashboard(path string) (dashboard, error) {
	var d dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, errors.Newf("%s: %w", path, err)
	}
	return d, nil
}

// exprs returns the dashboard's PromQL: every panel target's expression,
// rows' panels included, keyed `panel <id> "<title>"/<refId>` (titles
// repeat across rows; ids are unique, TestDashboardShape checks).
func (d dashboard) exprs() map[string]string {
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out[fmt.Sprintf("panel %d %q/%s", p.ID, p.Title, t.RefID)] = t.Expr
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// labelValues matches Grafana's label_values(expr, label) variable query.
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*\w+\s*\)\s*$`)

// variableExprs returns the PromQL inside the dashboard's query variables
// (the selector of label_values(selector, label)), keyed by variable name.
func (d dashboard) variableExprs() map[string]string {
	out := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			out["$"+v.Name] = m[1]
		} else if q != "" {
			out["$"+v.Name] = q
		}
	}
	return out
}

// runbookAnchor is the GitHub anchor of the runbook heading of an alert,
// "### Alert: IdrangeX" -> "alert-idrangex".
func runbookAnchor(alert string) string { return "alert-" + strings.ToLower(alert) }

// headingAnchors returns the GitHub-style anchors of the markdown headings
// in text (internal/tools/doclinks computes them for every link check).
func headingAnchors(text string) map[string]bool { return doclinks.Anchors(text) }
