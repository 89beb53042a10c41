package monitorcheck

import (
	"path/filepath"
	"strings"
	"testing"
)

// The dashboard is one Grafana dashboard that imports as it is: a stable
// uid, a current schema, the region and replica variables, unique panel
// ids, and a query in every panel that is not a row.
func TestDashboardShape(t *testing.T) {
	d, err := readDashboard(filepath.Join(repoRoot(), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed for provisioning", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want a current one (>= 36)", d.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	for _, want := range []string{"datasource", "region", "instance"} {
		if !vars[want] {
			t.Errorf("dashboard lacks the $%s variable", want)
		}
	}
	ids := map[int]string{}
	queries := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or shared with %q", p.Title, p.ID, other)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" {
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
				for _, tg := range p.Targets {
					if tg.Expr != "" {
						queries++
					}
					if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
						t.Errorf("panel %q: a target without expr or refId", p.Title)
					}
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(d.exprs()) < 20 || len(d.exprs()) != queries {
		t.Errorf("exprs() found %d of the %d queries in %s; the panel walk is broken", len(d.exprs()), queries, dashboardFile)
	}
}
