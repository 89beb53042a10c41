package promrule

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

const (
	rulesPath = "../../../deploy/prometheus/idrange.rules.yml"
	crPath    = "../../../deploy/kubernetes/prometheusrule.yaml"
)

// The committed PrometheusRule is exactly what the rules file generates:
// editing one without the other fails here.
func TestCommittedPrometheusRuleIsGenerated(t *testing.T) {
	rules, rerr := os.ReadFile(rulesPath)
	committed, cerr := os.ReadFile(crPath)
	switch {
	case errors.Is(rerr, os.ErrNotExist):
		t.Fatalf("%s is missing: restore the alerting rules (%s is generated from them)", rulesPath, crPath)
	case rerr != nil:
		t.Fatal(rerr)
	case errors.Is(cerr, os.ErrNotExist):
		t.Fatalf("%s is missing: run `go generate ./internal/tools/promrule` and commit it", crPath)
	case cerr != nil:
		t.Fatal(cerr)
	}
	want, err := Generate(rules)
	if err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	if !bytes.Equal(committed, want) {
		t.Fatalf("%s differs from what %s generates: run `go generate ./internal/tools/promrule` and commit it", crPath, rulesPath)
	}
}

const sample = `groups:
  - name: idrange.recording
    rules:
      - record: idrange:grants:rate5m
        expr: sum by (region) (rate(idrange_grants_total[5m]))
  - name: idrange.alerts
    interval: 30s
    rules:
      - alert: IdrangeClockRollback
        expr: |
          max by (instance) (idrange_clock_rollback_ms) > 0
        for: 1m
        labels:
          severity: page
        annotations:
          summary: "Clock rollback on {{ $labels.instance }}"
          description: "See docs/operations.md#clock-rollback."
`

func TestGenerate(t *testing.T) {
	out, err := Generate([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), Header) {
		t.Fatalf("output does not start with the generated-code header:\n%s", out)
	}
	again, err := Generate([]byte(sample))
	if err != nil || !bytes.Equal(out, again) {
		t.Fatalf("two generations differ (err %v)", err)
	}
	var pr PrometheusRule
	if err := DecodeStrict(out, &pr); err != nil {
		t.Fatalf("generated resource does not decode strictly: %v\n%s", err, out)
	}
	f, _ := Parse([]byte(sample))
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name != Name ||
		pr.Metadata.Namespace != Namespace || !reflect.DeepEqual(pr.Spec.Groups, f.Groups) {
		t.Fatalf("generated resource = %+v; want the rules file's groups under spec", pr)
	}
	if pr.Spec.Groups[1].Rules[0].Expr != "max by (instance) (idrange_clock_rollback_ms) > 0\n" {
		t.Fatalf("expr not kept as written: %q", pr.Spec.Groups[1].Rules[0].Expr)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, body, msg string }{
		{"unknown field", "groups:\n  - name: a\n    rules:\n      - alert: A\n        expr: up\n        severity: page\n", "unknown field"},
		{"field name case", "groups:\n  - name: a\n    rules:\n      - alert: A\n        Expr: up\n", "unknown field"},
		{"duplicate key", "groups:\n  - name: a\n    name: b\n    rules: []\n", "already set"},
		{"no groups", "groups: []\n", "no groups"},
		{"unnamed group", "groups:\n  - rules:\n      - alert: A\n        expr: up\n", "no name"},
		{"duplicate group", "groups:\n  - name: a\n    rules: [{alert: A, expr: up}]\n  - name: a\n    rules: [{alert: B, expr: up}]\n", "twice"},
		{"empty group", "groups:\n  - name: a\n    rules: []\n", "no rules"},
		{"record and alert", "groups:\n  - name: a\n    rules: [{alert: A, record: a, expr: up}]\n", "exactly one"},
		{"neither", "groups:\n  - name: a\n    rules: [{expr: up}]\n", "exactly one"},
		{"empty expr", "groups:\n  - name: a\n    rules: [{alert: A}]\n", "empty expr"},
		{"recording with for", "groups:\n  - name: a\n    rules: [{record: a, expr: up, for: 1m}]\n", "recording rule"},
		{"bad for", "groups:\n  - name: a\n    rules: [{alert: A, expr: up, for: soon}]\n", `for "soon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Parse = %v; want ErrInvalid naming %q", err, tc.msg)
			}
		})
	}
}
