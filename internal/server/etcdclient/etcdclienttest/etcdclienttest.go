// Package etcdclienttest starts an embedded etcd secured as production
// clusters are (TLS client certificates, auth with a user limited to the
// key prefix, short auth token TTL) for tests of the etcd security options.
package etcdclienttest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/server/etcdclient"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/testpki"
)

// TokenTTL is the secure etcd's simple auth token TTL.
const TokenTTL = 2 * time.Second

// Etcd is an embedded etcd that requires client certificates signed by
// its CA and has auth enabled, with the user "idrange" (password in
// PasswordFile) limited to etcdstore.DefaultPrefix by the role "idrange"
// (the RBAC of docs/operations.md), and auth tokens expiring after
// TokenTTL.
type Etcd struct {
	Endpoint     string        // https://127.0.0.1:port
	Dir          string        // holds the PEM files
	CAFile       string        // the CA of etcd's and the client's certificates
	Client       testpki.Files // a client certificate etcd accepts
	PasswordFile string        // the idrange user's password, "s3cret"
}

// Start starts the etcd; the test's cleanup stops it. Skipped with -short.
func Start(t testing.TB) *Etcd {
	t.Helper()
	if testing.Short() {
		t.Skip("embedded etcd with TLS and auth: skipped with -short")
	}
	dir := t.TempDir()
	s := &Etcd{Dir: dir}
	ca, err := testpki.NewCA("etcd CA")
	if err != nil {
		t.Fatal(err)
	}
	if s.CAFile, err = ca.WriteFile(dir, "ca.crt"); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("etcd")
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := srv.WriteFiles(dir, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Client(testpki.Identity{CN: "rangesvc"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Client, err = cli.WriteFiles(dir, "client"); err != nil {
		t.Fatal(err)
	}
	s.PasswordFile = filepath.Join(dir, "password")
	if err := os.WriteFile(s.PasswordFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ec := embed.NewConfig()
	ec.Name, ec.Dir = "sec", filepath.Join(dir, "data")
	cu := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	pu := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile = srvFiles.Cert, srvFiles.Key
	ec.ClientTLSInfo.TrustedCAFile, ec.ClientTLSInfo.ClientCertAuth = s.CAFile, true
	ec.AuthToken, ec.AuthTokenTTL = "simple", uint(TokenTTL/time.Second)
	// The cheapest password hashing: this etcd runs inside the test binary,
	// under the race detector too, where bcrypt's default cost takes
	// seconds per authentication and would time out the re-authentications
	// this test is about.
	ec.BcryptCost = 4
	ec.LogLevel = "error"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	s.Endpoint = "https://" + e.Clients[0].Addr().String()

	// Users and roles, then auth on (as the etcdctl commands of
	// docs/operations.md do).
	admin, err := etcdclient.Open(context.Background(), etcdclient.Options{
		Endpoints: []string{s.Endpoint}, CACert: s.CAFile, Cert: s.Client.Cert, Key: s.Client.Key})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "idrange"); return err },
		func() error {
			p := etcdstore.DefaultPrefix
			_, err := admin.RoleGrantPermission(ctx, "idrange", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := admin.UserAdd(ctx, "idrange", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "idrange", "idrange"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for i, f := range steps {
		if err := f(); err != nil {
			t.Fatalf("auth setup step %d: %v", i, err)
		}
	}
	return s
}

// Options are the etcdclient options of the idrange user.
func (s *Etcd) Options() etcdclient.Options {
	return etcdclient.Options{
		Endpoints: []string{s.Endpoint}, CACert: s.CAFile, Cert: s.Client.Cert, Key: s.Client.Key,
		User: "idrange", PasswordFile: s.PasswordFile, DialTimeout: 3 * time.Second,
	}
}
