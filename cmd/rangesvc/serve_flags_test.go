package main

import (
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// Bad flags of serve and mint exit 2 with a message naming the problem,
// before anything is started (no etcd, no listener).
func TestBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"serve"}, "--region is required"},
		{[]string{"serve", "--region", "4"}, "--region 4 not in 0..3"},
		{[]string{"serve", "--region", "-2"}, "--region -2 not in 0..3"},
		{[]string{"serve", "--region", "x"}, "invalid value"},
		{[]string{"serve", "--region", "0", "--data-dir", "/tmp/x", "--etcd", "127.0.0.1:2379"}, "mutually exclusive"},
		{[]string{"serve", "--region", "0", "--listen", "nonsense"}, "--listen \"nonsense\": want host:port"},
		{[]string{"serve", "--region", "0", "--listen", "127.0.0.1:70000"}, "--listen"},
		{[]string{"serve", "--region", "0", "--metrics", "127.0.0.1:abc"}, "--metrics"},
		{[]string{"serve", "--region", "0", "--etcd", "localhost"}, "--etcd endpoint 1"},
		{[]string{"serve", "--region", "0", "--etcd", "127.0.0.1:2379,ftp://x:1"}, "--etcd endpoint 2"},
		{[]string{"serve", "--region", "0", "--etcd", ","}, "no endpoints"},
		{[]string{"serve", "--region", "0", "--etcd-client-url", "http://127.0.0.1:1"}, "--etcd-client-url http://127.0.0.1:1: the embedded etcd serves https only"},
		{[]string{"serve", "--region", "0", "--etcd-peer-url", "http://127.0.0.1:1"}, "--etcd-peer-url http://127.0.0.1:1: the embedded etcd serves https only"},
		{[]string{"serve", "--region", "0", "--etcd-peer-url", "127.0.0.1:1"}, "--etcd-peer-url"},
		{[]string{"serve", "--region", "0", "--etcd-client-url", "https://:2379"}, `--etcd-client-url "https://:2379": want https://host:port`},
		{[]string{"serve", "--region", "0", "--etcd-client-url", "https://0.0.0.0:2379"}, "--etcd-client-url https://0.0.0.0:2379 is not a loopback address"},
		{[]string{"serve", "--region", "0", "--etcd-peer-url", "https://[::]:0"}, "--etcd-peer-url https://[::]:0 is not a loopback address"},
		{[]string{"serve", "--region", "0", "--etcd-client-url", "https://10.1.2.3:2379", "--etcd-peer-url", "https://10.1.2.3:2380"}, "needs --insecure"},
		{[]string{"serve", "--region", "0", "--lease-ttl", "1s"}, "--lease-ttl"},
		{[]string{"serve", "--region", "0", "--lease-ttl", "2500ms"}, "whole seconds"},
		{[]string{"serve", "--region", "0", "--max-block", "0"}, "--max-block 0"},
		{[]string{"serve", "--region", "0", "--max-lead", "10ms"}, "--max-lead"},
		{[]string{"serve", "--region", "0", "--rollback-bound", "-1ms"}, "--rollback-bound"},
		{[]string{"serve", "--region", "0", "--max-clock-skew", "-1ms"}, "--max-clock-skew -1ms not in 0s..1h"},
		{[]string{"serve", "--region", "0", "--max-clock-skew", "2h"}, "--max-clock-skew 2h0m0s not in 0s..1h"},
		{[]string{"serve", "--region", "0", "--shared-rate", "-1"}, "--shared-rate -1 not in 0..1000000000 IDs/s"},
		{[]string{"serve", "--region", "0", "--key-prefix", "idrange"}, "--key-prefix"},
		{[]string{"serve", "--region", "0", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--region", "0", "--shutdown-timeout", "0s"}, "--shutdown-timeout"},
		{[]string{"serve", "--region", "0", "--data-dir", ""}, "--data-dir must not be empty"},
		{[]string{"serve", "--region", "0", "--drain-delay", "-1s"}, "--drain-delay -1s must not be negative"},
		{[]string{"serve", "--region", "0", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"serve", "--region", "0", "--config", ""}, "--config: empty file name"},
		{[]string{"serve", "--region", "0", "--config", "/nonexistent/rangesvc.yaml"}, "no such file"},
		{[]string{"serve", "--region", "0", "extra"}, "unexpected arguments"},
		{[]string{"serve", "--region", "0", "--no-such-flag"}, "flag provided but not defined"},
		{[]string{"mint"}, "--target is required"},
		{[]string{"mint", "--target", "127.0.0.1:1"}, "-n 0 not in"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "-3"}, "-n -3 not in"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1000000000"}, "not in 1..100000000"},
		{[]string{"mint", "--target", "nohost", "-n", "1"}, "--target"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--region", "9"}, "--region 9 not in 0..3"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--region", "-2"}, "--region -2 not in 0..3"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--region", "x"}, "invalid value"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--timeout", "0s"}, "--timeout"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "junk"}, "unexpected arguments"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errs := runCmd(tc.args...)
			if code != cli.ExitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", code, cli.ExitUsage, errs)
			}
			if out != "" {
				t.Fatalf("stdout not empty: %q", out)
			}
			if !strings.Contains(errs, tc.msg) {
				t.Fatalf("stderr %q does not contain %q", errs, tc.msg)
			}
		})
	}
}

func TestServeFlagsDefaults(t *testing.T) {
	c, err := parseServeFlags([]string{"--region", "2"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != defaultListen || c.Metrics != defaultMetrics || c.DataDir != defaultDataDir ||
		c.DrainDelay != defaultDrainDelay || c.LogFormat != logText || c.ConfigFile != "" ||
		c.LeaseTTL != store.DefaultLeaseTTL || c.MaxLead != segment.DefaultMaxLead || len(c.Etcd) != 0 || c.Region != 2 ||
		c.SharedRate != service.DefaultSharedRate || c.sharedRate() != service.DefaultSharedRate ||
		c.EtcdClientURL != "https://127.0.0.1:2379" || c.EtcdPeerURL != "https://127.0.0.1:2380" ||
		c.MaxClockSkew != defaultMaxClockSkew {
		t.Fatalf("defaults = %+v", c)
	}
	// The restart floor is on with an external etcd, which --max-clock-skew
	// sizes, and off on the embedded one (down whenever the replica is).
	if sc := c.storeConfig(); sc.RestartFloor {
		t.Fatalf("store config %+v: a restart floor on the embedded etcd", sc)
	}
	ext, err := parseServeFlags([]string{"--region", "2", "--etcd", "etcd-1:2379", "--insecure"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if sc := ext.storeConfig(); !sc.RestartFloor || sc.MaxClockSkew != defaultMaxClockSkew || sc.Policy.MaxLead != ext.MaxLead {
		t.Fatalf("store config %+v with --etcd: want the restart floor with --max-clock-skew and --max-lead", sc)
	}
	// --shared-rate 0 turns the shared path off (a negative service rate).
	if c, err := parseServeFlags([]string{"--region", "2", "--shared-rate", "0"}, &strings.Builder{}); err != nil || c.sharedRate() >= 0 {
		t.Fatalf("--shared-rate 0: rate %v, %v; want off", c.sharedRate(), err)
	}
	// The embedded etcd on another interface, on purpose.
	c, err = parseServeFlags([]string{"--region", "2", "--insecure", "--etcd-client-url", "https://0.0.0.0:2379",
		"--etcd-peer-url", "https://10.1.2.3:2380"}, &strings.Builder{})
	if err != nil || c.EtcdClientURL != "https://0.0.0.0:2379" {
		t.Fatalf("--insecure with a wide embedded etcd: %+v, %v", c, err)
	}
	c, err = parseServeFlags([]string{"--region", "1", "--etcd", "10.0.0.1:2379, http://10.0.0.2:2379"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Etcd) != 2 || c.Etcd[1] != "http://10.0.0.2:2379" {
		t.Fatalf("etcd = %q", c.Etcd)
	}
}
