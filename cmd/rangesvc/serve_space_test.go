package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/etcdspace"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// The compaction and quota flags: bad values exit 2 naming the flag; the
// defaults are etcdspace's; --compaction-interval 0 also turns the embedded
// etcd's own auto-compaction off.
func TestServeSpaceFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--compaction-interval", "-1s"}, "--compaction-interval -1s must not be negative"},
		{[]string{"--compaction-interval", "10ms"}, "--compaction-interval 10ms must be at least 1s"},
		{[]string{"--compaction-retention", "0s"}, "--compaction-retention 0s must be at least 1s"},
		{[]string{"--etcd-quota-bytes", "1000"}, "--etcd-quota-bytes 1000 must be at least"},
		{[]string{"--etcd-quota-bytes", "2GiB"}, "invalid value"},
	} {
		args := append([]string{"serve", "--region", "0"}, tc.args...)
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, errs := runCmd(args...)
			if code != cli.ExitUsage || !strings.Contains(errs, tc.msg) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errs, cli.ExitUsage, tc.msg)
			}
		})
	}

	c, err := parseServeFlags([]string{"--region", "0"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.CompactionInterval != etcdspace.DefaultCompactionInterval || c.CompactionRetention != etcdspace.DefaultCompactionRetention ||
		c.EtcdQuotaBytes != etcdspace.DefaultQuotaBytes || c.embeddedAutoCompaction() != etcdspace.DefaultCompactionRetention {
		t.Fatalf("defaults: %+v", c)
	}
	rc := c.replicaConfig(nil, nil, nil, slog.New(slog.DiscardHandler))
	if rc.CompactionInterval != c.CompactionInterval || rc.CompactionRetention != c.CompactionRetention || rc.EtcdQuotaBytes != c.EtcdQuotaBytes {
		t.Fatalf("replica config does not carry the flags: %+v", rc)
	}
	c, err = parseServeFlags([]string{"--region", "0", "--compaction-interval", "0", "--compaction-retention", "1h", "--etcd-quota-bytes", "16777216"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.CompactionInterval != 0 || c.CompactionRetention != time.Hour || c.EtcdQuotaBytes != 16<<20 || c.embeddedAutoCompaction() != 0 {
		t.Fatalf("parsed: %+v, embedded auto-compaction %v", c, c.embeddedAutoCompaction())
	}
}

// `rangesvc serve` on its embedded etcd: the quota flag reaches the member
// (which reports it: idrange_etcd_quota_bytes), the replica leads the
// compactor and compacts, and the space metrics are exported.
func TestServeCompactsAndExportsSpace(t *testing.T) {
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: []string{
		"--compaction-interval", "1s", "--compaction-retention", "1s", "--etcd-quota-bytes", "67108864"}})
	if !p.WaitStderr("compactor: leading", 30*time.Second) || !p.WaitStderr("compactor: compacted to revision", 30*time.Second) {
		t.Fatalf("serve did not lead and compact:\n%s", p.Stderr())
	}
	var m string
	deadline := time.Now().Add(30 * time.Second)
	for {
		m = p.Scrape(t)
		if strings.Contains(m, "\nidrange_etcd_quota_bytes 6.7108864e+07\n") && strings.Contains(m, "idrange_etcd_backend_bytes{member=") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("space metrics missing or quota not the flag's:\n%s", m)
		}
		time.Sleep(200 * time.Millisecond) // poll pace
	}
	for _, want := range []string{"\nidrange_compactor_leader 1\n", "\nidrange_etcd_alarm{alarm=\"NOSPACE\"} 0\n", "idrange_etcd_backend_in_use_bytes{member="} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, m)
		}
	}
}
