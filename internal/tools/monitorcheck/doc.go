// Package monitorcheck keeps the monitoring files under deploy/ honest: its
// tests parse every rule expression and dashboard query with Prometheus's
// PromQL parser (imported by test files only, so nothing shipped links it),
// run promtool over the alerting rules and their unit tests, check
// that every alert has a runbook section in docs/operations/alerts.md and a test
// case that makes it fire, and check that every metric name the rules and
// the Grafana dashboard use is exported by the real registries of a
// rangesvc replica and a rangeclient (docs/operations/alerts.md, "Alerts and
// runbooks").
package monitorcheck
