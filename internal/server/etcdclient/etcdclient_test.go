package etcdclient_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/etcdclient"
	"github.com/idrange/idrange/internal/server/etcdclient/etcdclienttest"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/testpki"
)

// A replica's store over etcd with TLS client certificates and a user
// limited to the key prefix grants and renews; its renewals keep
// succeeding across auth-token expiry (gaps longer than the token TTL,
// for more than 3x the TTL); a wrong password or a missing client
// certificate fails Open with one line naming the problem.
func TestSecureEtcd(t *testing.T) {
	s := etcdclienttest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cli, err := etcdclient.Open(ctx, s.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	stg, err := etcdstore.New(cli, etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(stg, store.Config{LeaseTTL: 10 * time.Second})
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
	gap := etcdclienttest.TokenTTL + etcdclienttest.TokenTTL/2 // the token expires between two renewals
	start := time.Now()
	for i := 0; time.Since(start) < 3*etcdclienttest.TokenTTL || i < 3; i++ {
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
		o := s.Options()
		o.PasswordFile = filepath.Join(s.Dir, "wrong")
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
		o := s.Options()
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
