package etcdclient_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/etcdclient"
	"github.com/idrange/idrange/internal/testpki"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/segment/etcdstore"
)

const tokenTTL = 2 * time.Second // etcd's simple-token TTL in this test

// secureEtcd is an embedded etcd that requires client certificates signed
// by its CA and has auth enabled, with the user "idrange" limited to
// etcdstore.DefaultPrefix by the role "idrange" (the RBAC of
// docs/operations.md).
type secureEtcd struct {
	endpoint string
	dir      string
	caFile   string
	client   testpki.Files // a client certificate etcd accepts
	pwFile   string
}

func startSecureEtcd(t *testing.T) *secureEtcd {
	t.Helper()
	if testing.Short() {
		t.Skip("embedded etcd with TLS and auth: skipped with -short")
	}
	dir := t.TempDir()
	s := &secureEtcd{dir: dir}
	ca, err := testpki.NewCA("etcd CA")
	if err != nil {
		t.Fatal(err)
	}
	if s.caFile, err = ca.WriteFile(dir, "ca.crt"); err != nil {
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
	if s.client, err = cli.WriteFiles(dir, "client"); err != nil {
		t.Fatal(err)
	}
	s.pwFile = filepath.Join(dir, "password")
	if err := os.WriteFile(s.pwFile, []byte("s3cret\n"), 0o600); err != nil {
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
	ec.ClientTLSInfo.TrustedCAFile, ec.ClientTLSInfo.ClientCertAuth = s.caFile, true
	ec.AuthToken, ec.AuthTokenTTL = "simple", uint(tokenTTL/time.Second)
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
	s.endpoint = "https://" + e.Clients[0].Addr().String()

	// Users and roles, then auth on (as the etcdctl commands of
	// docs/operations.md do).
	admin, err := etcdclient.Open(context.Background(), etcdclient.Options{
		Endpoints: []string{s.endpoint}, CACert: s.caFile, Cert: s.client.Cert, Key: s.client.Key})
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

func (s *secureEtcd) options() etcdclient.Options {
	return etcdclient.Options{
		Endpoints: []string{s.endpoint}, CACert: s.caFile, Cert: s.client.Cert, Key: s.client.Key,
		User: "idrange", PasswordFile: s.pwFile, DialTimeout: 3 * time.Second,
	}
}

// A replica's store over etcd with TLS client certificates and a user
// limited to the key prefix grants and renews; its renewals keep
// succeeding across auth-token expiry (gaps longer than the token TTL,
// for more than 3x the TTL); a wrong password or a missing client
// certificate fails Open with one line naming the problem.
func TestSecureEtcd(t *testing.T) {
	s := startSecureEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cli, err := etcdclient.Open(ctx, s.options())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	stg, err := etcdstore.New(cli, etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := segment.NewStore(stg, segment.StoreConfig{LeaseTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.Acquire(ctx, 0, "secure")
	if err != nil {
		t.Fatal(err)
	}
	// Outside its prefix the user can do nothing.
	if _, err := cli.Put(ctx, "/elsewhere", "x"); err == nil {
		t.Fatal("the idrange user wrote outside its prefix")
	}
	gap := tokenTTL + tokenTTL/2 // the token expires between two renewals
	start := time.Now()
	for i := 0; time.Since(start) < 3*tokenTTL || i < 3; i++ {
		time.Sleep(gap) // idling on purpose: the token must expire
		if _, err := st.Renew(ctx, l); err != nil {
			t.Fatalf("renewal %d, %v after the first lease: %v", i, time.Since(start).Round(time.Millisecond), err)
		}
		if _, err := st.Allocate(ctx, l, 4096); err != nil {
			t.Fatalf("grant %d, %v after the first lease: %v", i, time.Since(start).Round(time.Millisecond), err)
		}
	}
	if err := st.Release(ctx, l); err != nil {
		t.Fatal(err)
	}

	t.Run("WrongPassword", func(t *testing.T) {
		o := s.options()
		o.PasswordFile = filepath.Join(s.dir, "wrong")
		if err := os.WriteFile(o.PasswordFile, []byte("guess\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := etcdclient.Open(ctx, o)
		if err == nil || errors.Is(err, etcdclient.ErrUsage) || !strings.Contains(err.Error(), "authentication failed") ||
			strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "guess") {
			t.Fatalf("wrong password: %v; want one line saying authentication failed, without the password", err)
		}
	})
	t.Run("NoClientCertificate", func(t *testing.T) {
		o := s.options()
		o.Cert, o.Key = "", ""
		o.DialTimeout = time.Second
		_, err := etcdclient.Open(ctx, o)
		if err == nil || errors.Is(err, etcdclient.ErrUsage) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("without a client certificate: %v; want a one-line connection error", err)
		}
		t.Logf("without a client certificate: %v", err)
	})
}

// Bad options are ErrUsage and name their flag.
func TestBadOptions(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	ca, err := testpki.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Client(testpki.Identity{CN: "x"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.WriteFiles(dir, "c")
	if err != nil {
		t.Fatal(err)
	}
	ep := []string{"https://127.0.0.1:2379"}
	for _, tc := range []struct {
		o    etcdclient.Options
		flag string
	}{
		{etcdclient.Options{Endpoints: ep, User: "u", PasswordFile: missing}, "--etcd-password-file"},
		{etcdclient.Options{Endpoints: ep, User: "u", PasswordFile: empty}, "--etcd-password-file"},
		{etcdclient.Options{Endpoints: ep, User: "u"}, "--etcd-password-file"},
		{etcdclient.Options{Endpoints: ep, PasswordFile: empty}, "--etcd-user"},
		{etcdclient.Options{Endpoints: ep, Cert: f.Cert, Key: missing}, "--etcd-key"},
		{etcdclient.Options{Endpoints: ep, Cert: f.Cert}, "--etcd-key"},
		{etcdclient.Options{Endpoints: ep, Cert: empty, Key: f.Key}, "--etcd-cert"},
		{etcdclient.Options{Endpoints: ep, CACert: empty}, "--etcd-cacert"},
	} {
		_, err := tc.o.Config()
		if !errors.Is(err, etcdclient.ErrUsage) || !strings.HasPrefix(err.Error(), tc.flag+": ") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v; want a one-line ErrUsage naming %s", tc.o, err, tc.flag)
		}
	}
}
