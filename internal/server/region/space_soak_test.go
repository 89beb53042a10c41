//go:build soak

package region_test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/tlsfiles"
)

// Issue 14's soak: `rangesvc serve` on its embedded etcd under >= 2,000
// grants/s for IDRANGE_SOAK_DURATION (default 10m), compacting every 30 s
// with 30 s retention. Every 5 s it samples etcd's revision history (current
// revision - compacted revision, from the embedded etcd's own /metrics),
// the backend bytes in use and the serve process's RSS; each must plateau:
// the last third's maximum at most 1.2x the middle third's.
//
//	go test -tags soak -run TestSoakSpacePlateaus -timeout 30m -count=1 -v ./internal/server/region/
func TestSoakSpacePlateaus(t *testing.T) {
	dur := 10 * time.Minute
	if s := os.Getenv("IDRANGE_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("IDRANGE_SOAK_DURATION: %v", err)
		}
		dur = d
	}
	const every = 5 * time.Second
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 1, Args: []string{
		"--compaction-interval", "30s", "--compaction-retention", "30s", "--log-level", "info"}})
	etcd := p.EmbeddedEtcd(t)
	etcdURL := etcd.Endpoint
	tc, err := tlsfiles.Files{CA: etcd.PKI.CACert, Cert: etcd.PKI.ClientCert, Key: etcd.PKI.ClientKey}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	etcdHTTP := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}

	g := startGrantLoad(t, p.GRPCAddr, 1, 64, 3000)
	type point struct {
		at                  time.Duration
		grants              int64
		history, inUse, rss float64
	}
	var pts []point
	start := time.Now()
	for time.Since(start) < dur {
		time.Sleep(every) // sampling period
		em := scrapeMetrics(t, etcdHTTP, etcdURL+"/metrics")
		pt := point{at: time.Since(start), grants: g.grants.Load(),
			history: em["etcd_debugging_mvcc_current_revision"] - em["etcd_debugging_mvcc_compact_revision"],
			inUse:   em["etcd_mvcc_db_total_size_in_use_in_bytes"], rss: rssBytes(t, p.Cmd.Process.Pid)}
		pts = append(pts, pt)
		t.Logf("SAMPLE t=%4.0fs grants=%d rate=%.0f/s history=%.0f revisions in_use=%.0f bytes rss=%.1f MB fails=%d",
			pt.at.Seconds(), pt.grants, float64(pt.grants)/pt.at.Seconds(), pt.history, pt.inUse, pt.rss/(1<<20), g.fails.Load())
	}
	g.stop()
	elapsed := time.Since(start)
	rate := float64(g.grants.Load()) / elapsed.Seconds()
	third := len(pts) / 3
	mid, last := pts[third:2*third], pts[2*third:]
	maxOf := func(ps []point, f func(point) float64) float64 {
		v := 0.0
		for _, p := range ps {
			v = max(v, f(p))
		}
		return v
	}
	t.Logf("FIGURES soak %v: %d grants (%.0f/s), %d failed; max history %.0f / %.0f revisions, in use %.0f / %.0f bytes, RSS %.1f / %.1f MB (middle / last third); first sample RSS %.1f MB",
		elapsed.Round(time.Second), g.grants.Load(), rate, g.fails.Load(),
		maxOf(mid, func(p point) float64 { return p.history }), maxOf(last, func(p point) float64 { return p.history }),
		maxOf(mid, func(p point) float64 { return p.inUse }), maxOf(last, func(p point) float64 { return p.inUse }),
		maxOf(mid, func(p point) float64 { return p.rss })/(1<<20), maxOf(last, func(p point) float64 { return p.rss })/(1<<20),
		pts[0].rss/(1<<20))
	if rate < 2000 {
		t.Errorf("the load ran at %.0f grants/s, below the 2,000 grants/s the soak is for", rate)
	}
	if g.fails.Load() > 0 {
		t.Errorf("%d grants failed (last: %v)", g.fails.Load(), g.err())
	}
	for _, q := range []struct {
		name string
		f    func(point) float64
	}{
		{"revision history", func(p point) float64 { return p.history }},
		{"backend bytes in use", func(p point) float64 { return p.inUse }},
		{"serve RSS", func(p point) float64 { return p.rss }},
	} {
		if a, b := maxOf(mid, q.f), maxOf(last, q.f); b > 1.2*a {
			t.Errorf("%s does not plateau: last third's max %.0f > 1.2 x middle third's %.0f", q.name, b, a)
		}
	}
	if !strings.Contains(p.Stderr(), "compactor: compacted to revision") {
		t.Error("serve logged no compaction")
	}
}

// scrapeMetrics reads the unlabelled samples of a Prometheus text page
// with c.
func scrapeMetrics(t testing.TB, c *http.Client, url string) map[string]float64 {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || strings.HasPrefix(f[0], "#") || strings.Contains(f[0], "{") {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}

// rssBytes is the process's resident set size from /proc.
func rssBytes(t testing.TB, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("rss of %d: %v", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb * 1024
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}
