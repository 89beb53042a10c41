package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// Issue 24: the embedded etcd of a real `rangesvc serve` is closed. On the
// default loopback URL and on an address given with --etcd-client-url, a
// client without the certificate serve made in <data-dir>/pki cannot read
// or write it (no client certificate, plaintext http, plain HTTP), and its
// peer port refuses a client without a certificate; with the generated
// client certificate, as docs/operations.md tells operators, the
// replica's records are readable. Keys are 0600 in a 0700 directory, the
// replica mints, and a restart reuses the PKI.
func TestServeEmbeddedEtcdClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rangesvc: skipped with -short")
	}
	for _, tc := range []struct {
		name string
		args []string // after testenv's --etcd-client-url https://127.0.0.1:0 (the default's host)
		host string
	}{
		{"default loopback", nil, "127.0.0.1"},
		{"given address", []string{"--etcd-client-url", "https://127.0.0.2:0", "--etcd-peer-url", "https://127.0.0.2:0"}, "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testenv.ServeConfig{Region: 1, Args: tc.args}
			p := testenv.StartServe(t, cfg)
			etcd := p.EmbeddedEtcd(t)
			if !strings.HasPrefix(etcd.Endpoint, "https://"+tc.host+":") || !strings.HasPrefix(etcd.Peer, "https://"+tc.host+":") {
				t.Fatalf("embedded etcd at %s, peer %s; want https on %s", etcd.Endpoint, etcd.Peer, tc.host)
			}
			embedetcdtest.RequireClosed(t, etcd.Endpoint, etcd.Peer, etcd.PKI)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r, err := etcd.Client(t).Get(ctx, etcdstore.DefaultPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || r.Count == 0 {
				t.Fatalf("the replica's keys with the generated client certificate: %v, %v", r, err)
			}
			if fi, err := os.Stat(etcd.PKI.Dir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("%s: %v %v, want mode 0700", etcd.PKI.Dir, fi.Mode(), err)
			}
			for _, k := range []string{etcd.PKI.CAKey, etcd.PKI.ServerKey, etcd.PKI.ClientKey} {
				if fi, err := os.Stat(k); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: %v %v, want mode 0600", k, fi.Mode(), err)
				}
			}
			if !strings.Contains(p.Stderr(), `msg="embedded etcd pki" change="made a new CA `+etcd.PKI.CACert+`"`) {
				t.Errorf("serve did not log the new CA:\n%s", p.Stderr())
			}
			p.Mint(t, 1, 3) // checks them: 3, distinct, of region 1, dated now
			if tc.args != nil {
				return
			}

			// A restart on the same data dir reuses every file.
			ca, err := os.ReadFile(etcd.PKI.CACert)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Stop(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			cfg.DataDir = p.DataDir
			p = testenv.StartServe(t, cfg)
			if strings.Contains(p.Stderr(), "embedded etcd pki") {
				t.Errorf("a restart changed the PKI:\n%s", p.Stderr())
			}
			if again, _ := os.ReadFile(etcd.PKI.CACert); !bytes.Equal(again, ca) {
				t.Error("a restart replaced the CA")
			}
			p.Mint(t, 1, 3) // after the restart; checked as before
		})
	}
}
