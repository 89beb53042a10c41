package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/segment"
)

// serveArgs is serve on random loopback ports plus extra.
func serveArgs(extra ...string) []string {
	return append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--http", "",
		"--etcd-timeout", "2s", "--drain-delay", "0s"}, extra...)
}

func wantServeFailure(t *testing.T, args []string, want ...string) {
	t.Helper()
	code, _, errs := runCmd(args...)
	if code != cli.ExitFailure {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, cli.ExitFailure, errs)
	}
	last := lastLine(errs)
	for _, w := range append([]string{"serve failed"}, want...) {
		if !strings.Contains(last, w) {
			t.Fatalf("last stderr line %q does not say %q", last, w)
		}
	}
}

// Region identity: a fresh data dir initialises itself (the README's first
// command); `serve --region 2` on that region-1 data dir exits 1 naming
// both codes; a replica against an empty external etcd without
// --init-region exits 1 saying so, and with it starts.
func TestServeRegionRecordSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rangesvc: skipped with -short")
	}
	dir := t.TempDir()
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 1, DataDir: dir})
	p.Mint(t, 1, 3) // checks them: 3, distinct, of region 1, dated now
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	wantServeFailure(t, serveArgs("--region", "2", "--data-dir", dir,
		"--etcd-client-url", "https://127.0.0.1:0", "--etcd-peer-url", "https://127.0.0.1:0"),
		"this etcd holds region 1", "--region 2")

	e := embedetcdtest.Start(t)
	ep := e.Endpoints()[0]
	wantServeFailure(t, serveArgs("--region", "1", "--etcd", ep), "has no region record", "--init-region")
	p = testenv.StartServe(t, testenv.ServeConfig{Region: 1, Etcd: []string{ep}}) // testenv passes --init-region

	p.Mint(t, 1, 3) // checks them: 3, distinct, of region 1, dated now
	wantServeFailure(t, serveArgs("--region", "3", "--etcd", ep), "this etcd holds region 1", "--region 3")
}

func TestRegionFlagsBad(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--registry-etcd", "localhost"}, "--registry-etcd endpoint 1"},
		{[]string{"--registry-etcd", ","}, "no endpoints"},
		{[]string{"--registry-prefix", "reg"}, "--registry-prefix"},
		{[]string{"--registry-check-interval", "10ms"}, "--registry-check-interval"},
		{[]string{"--registry-cacert", "/nonexistent/ca.crt"}, "need --registry-etcd"},
		{[]string{"--registry-etcd", "https://127.0.0.1:2379,http://127.0.0.2:2379", "--registry-cacert", "/nonexistent/ca.crt"},
			"--registry-etcd http://127.0.0.2:2379 with --registry-cacert: an http:// endpoint makes the etcd client drop TLS"},
		{[]string{"--registry-etcd", "127.0.0.1:2379", "--registry-cacert", "/nonexistent/ca.crt"}, "--registry-cacert: "},
	} {
		code, _, errs := runCmd(append([]string{"serve", "--region", "1"}, tc.args...)...)
		if code != cli.ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errs, cli.ExitUsage, tc.want)
		}
	}
}

// `rangesvc admin status` shows the region record, and `admin
// restore-fence` lifts every code and records the fence.
func TestAdminRegionStatusAndRestoreFence(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	r := regiontest.Start(t, localregion.Config{Region: 2, Etcd: embedetcdtest.Start(t),
		Store: store.Config{Policy: segment.Policy{MaxBlock: segment.PerMs, MaxLead: time.Second}}})
	tgt := r.Addr()
	st := adminJSON[statusJSON](t, "status", "--target", tgt)
	if st.RegionRecord == nil || st.RegionRecord.Region != 2 || len(st.RegionRecord.RegionID) != 32 ||
		st.RegionRecord.RestorePending || st.RegionCheck != "ok" {
		t.Fatalf("status region record: %+v, check %q", st.RegionRecord, st.RegionCheck)
	}
	adminTable(t, []string{"region id", st.RegionRecord.RegionID, "registry claim", "none pending", "region check"},
		"status", "--target", tgt)
	out := adminTable(t, []string{"codes lifted", "256", "fenced to"}, "restore-fence", "--target", tgt, "--margin", "100ms")
	t.Logf("restore-fence:\n%s", out)
	st = adminJSON[statusJSON](t, "status", "--target", tgt)
	if st.RegionRecord.Fenced == nil || st.RegionRecord.RestorePending || st.MaxHWMLeadMs < 500 {
		t.Fatalf("after the fence: %+v, max lead %d ms", st.RegionRecord, st.MaxHWMLeadMs)
	}
	if code, _, errs := runCmd("admin", "restore-fence", "--target", tgt, "--margin", "1h"); code != cli.ExitUsage || !strings.Contains(errs, "--margin") {
		t.Fatalf("--margin 1h: exit %d, %q", code, errs)
	}
}
