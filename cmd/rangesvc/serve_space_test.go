package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/cli"
	"github.com/idrange/idrange/internal/etcdspace"
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
