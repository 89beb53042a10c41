// Package etcdclient opens the replica's etcd client from the operator's
// options: endpoints, TLS client certificates (--etcd-cacert, --etcd-cert,
// --etcd-key, as etcdctl names them) and a user whose password is read from
// a file (--etcd-user, --etcd-password-file; never a password on the command
// line, where ps and shell history would show it).
//
// With a user, the etcd client authenticates when it connects and again
// whenever etcd reports its auth token invalid (a simple token expires
// after etcd's --auth-token-ttl of inactivity, a JWT at its TTL), retrying
// the call: long-running replicas keep renewing leases across token expiry.
//
// Open fails with a one-line error naming the problem: errors wrapping
// ErrUsage are bad options (a missing or unreadable file, a certificate
// without its key: exit 2, naming the flag); others are etcd refusing or
// not answering (wrong password, a certificate etcd does not accept: exit 1).
package etcdclient

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/tlsfiles"
)

// ErrUsage marks errors in the options themselves (the operator's input).
var ErrUsage = errors.New("bad etcd option")

// DefaultDialTimeout bounds Open's connection and first request.
const DefaultDialTimeout = 5 * time.Second

// Flag names, used in error messages.
const (
	FlagCACert       = "--etcd-cacert"
	FlagCert         = "--etcd-cert"
	FlagKey          = "--etcd-key"
	FlagUser         = "--etcd-user"
	FlagPasswordFile = "--etcd-password-file"
)

// Options are how to reach and authenticate to etcd. Zero fields are
// unused.
type Options struct {
	// Endpoints are etcd's client URLs (https:// with TLS).
	Endpoints []string
	// CACert verifies etcd's server certificate (default: the system
	// roots when Cert is set or an endpoint is https).
	CACert string
	// Cert and Key are the client certificate etcd may require
	// (--client-cert-auth); re-read when rotated.
	Cert, Key string
	// User is the etcd user; its password is the first line of
	// PasswordFile. Both or neither.
	User, PasswordFile string
	// DialTimeout bounds the connection and Open's first request. Default
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// Logger is the etcd client's logger. Default: none.
	Logger *zap.Logger
	// Prefix is the key prefix of the replica's state: Open checks access
	// with a read under it (a user limited to the prefix can do nothing
	// else). Default etcdstore.DefaultPrefix.
	Prefix string
}

// usage is a bad-option error naming the flag.
func usage(flag, format string, args ...any) error {
	return errors.Newf("%s: %s: %w", flag, fmt.Sprintf(format, args...), ErrUsage)
}

// Config builds the etcd client configuration from o, reading the files.
func (o Options) Config() (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, Logger: o.Logger}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	https := false
	for _, ep := range o.Endpoints {
		https = https || strings.HasPrefix(ep, "https://")
	}
	if o.CACert != "" || o.Cert != "" || o.Key != "" || https {
		tc, err := tlsfiles.Files{Cert: o.Cert, Key: o.Key, CA: o.CACert}.ClientConfig()
		if err != nil {
			var fe *tlsfiles.FileError
			if errors.As(err, &fe) {
				flag := map[string]string{"cert": FlagCert, "key": FlagKey, "ca": FlagCACert}[fe.Role]
				return clientv3.Config{}, errors.Newf("%s: %v: %w", flag, err, ErrUsage)
			}
			return clientv3.Config{}, errors.Newf("etcd TLS: %v: %w", err, ErrUsage)
		}
		cfg.TLS = tc
	}
	switch {
	case o.User == "" && o.PasswordFile == "":
	case o.User == "":
		return clientv3.Config{}, usage(FlagUser, "required with %s", FlagPasswordFile)
	case o.PasswordFile == "":
		return clientv3.Config{}, usage(FlagPasswordFile, "required with %s (the password is never given on the command line)", FlagUser)
	default:
		pw, err := readPassword(o.PasswordFile)
		if err != nil {
			return clientv3.Config{}, err
		}
		cfg.Username, cfg.Password = o.User, pw
	}
	return cfg, nil
}

// readPassword returns the first line of path, without its line ending.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", usage(FlagPasswordFile, "%s: %v", path, err)
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimSuffix(pw, "\r")
	if pw == "" {
		return "", usage(FlagPasswordFile, "%s: the first line is empty", path)
	}
	return pw, nil
}

// Open connects to etcd with o and checks, with one read bounded by
// DialTimeout, that etcd accepts the client (TLS and user). The caller
// closes the client.
func Open(ctx context.Context, o Options) (*clientv3.Client, error) {
	cfg, err := o.Config()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg) // with a user, this authenticates
	if err != nil {
		return nil, errors.Newf("etcd %s: %s", strings.Join(o.Endpoints, ","), explain(ctx, err, cfg.DialTimeout))
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	prefix := o.Prefix
	if prefix == "" {
		prefix = etcdstore.DefaultPrefix
	}
	if _, err := cli.Get(pctx, prefix+"probe", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, errors.Newf("etcd %s: %s", strings.Join(o.Endpoints, ","), explain(ctx, err, cfg.DialTimeout))
	}
	return cli, nil
}

// explain is err on one line; a timeout (etcd closes a TLS connection it
// does not accept without a word the client could report) says what to
// check.
func explain(ctx context.Context, err error, timeout time.Duration) string {
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "context deadline exceeded")) {
		return fmt.Sprintf("no answer within %v (is etcd up at these endpoints, and does it accept this client's TLS certificate %s?)",
			timeout, FlagCert)
	}
	return oneLine(err)
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
