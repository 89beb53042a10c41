package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rangesvc.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Acceptance: a file plus a flag override gives the merged
// config; an unknown key and a bad value exit 2 naming the key (and the
// file).
func TestServeConfigFile(t *testing.T) {
	p := writeFile(t, `
region: 2
etcd: [10.0.0.1:2379, 10.0.0.2:2379]
lease-ttl: 20s
drain-delay: 0s
log-format: json
`)
	c, err := parseServeFlags([]string{"--config", p, "--lease-ttl", "30s", "--listen", "127.0.0.1:0"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != 2 || strings.Join(c.Etcd, ",") != "10.0.0.1:2379,10.0.0.2:2379" || c.LeaseTTL != 30*time.Second ||
		c.Listen != "127.0.0.1:0" || c.DrainDelay != 0 || c.LogFormat != logJSON || c.Metrics != defaultMetrics ||
		c.ConfigFile != p {
		t.Fatalf("merged config = %+v", c)
	}

	for _, tc := range []struct{ body, msg string }{
		{"region: 1\nlisten-addr: 127.0.0.1:0\n", `unknown key "listen-addr"`},
		{"region: one\n", `key "region": invalid value "one"`},
		{"region: 1\nlease-ttl: 2500ms\n", "--lease-ttl 2.5s must be whole seconds"}, // validated after merging
		{"region: 1\nlog-format: xml\n", `--log-format "xml"`},
		{"region: 1\nconfig: other.yaml\n", `key "config"`},
	} {
		f := writeFile(t, tc.body)
		code, out, errs := runCmd("serve", "--config", f)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d naming %q", tc.body, code, errs, cli.ExitUsage, tc.msg)
		}
		if strings.Contains(tc.msg, "key") && !strings.Contains(errs, f) {
			t.Errorf("%q: stderr %q does not name the file", tc.body, errs)
		}
	}
}

// The example file in docs parses: every key is a flag, every value valid.
func TestServeConfigExample(t *testing.T) {
	// The file names certificate and password files of a real host: the
	// same flags on the command line point them at test files (flags
	// override the file), so every key is still parsed and validated.
	p := newTestPKI(t, "etcd-client")
	pw := filepath.Join(p.dir, "password")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseServeFlags(append([]string{"--config", "../../docs/rangesvc.example.yaml"}, p.serverFlags(
		"--etcd-cacert", p.ca, "--etcd-cert", p.clients["etcd-client"].Cert, "--etcd-key", p.clients["etcd-client"].Key,
		"--etcd-password-file", pw)...), &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != 1 || len(c.Etcd) != 3 || c.LogFormat != logJSON || c.DrainDelay != 5*time.Second ||
		c.Security.Allowed != "cn:minter-*" || c.Security.Etcd.User != "idrange" || c.Security.MaxCodesPerIdentity != 64 {
		t.Fatalf("example config = %+v", c)
	}
}
