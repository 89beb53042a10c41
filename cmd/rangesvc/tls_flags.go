package main

import (
	"context"
	"crypto/tls"
	"flag"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/etcdclient"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/tlsfiles"
)

// securityFlags are serve's TLS, identity and etcd security flags (issue
// 10; docs/operations/security.md, "Security"). validate loads every file and
// pattern, so bad input fails before anything starts (exit 2, naming the
// flag); the loaded values are kept for the replica.
type securityFlags struct {
	TLSCert, TLSKey, TLSClientCA string // --tls-cert, --tls-key, --tls-client-ca
	Allowed, Admin               string // --tls-allowed-identities, --tls-admin-identities (comma lists)
	MetricsClientCA              string // --metrics-client-ca
	MaxCodesPerIdentity          int    // --max-codes-per-identity
	Insecure                     bool   // --insecure

	Etcd etcdclient.Options // --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user, --etcd-password-file

	// loaded is what validate read; allocated by register so that copies
	// of the config (Validate has a value receiver) share it.
	loaded *loadedSecurity
}

// loadedSecurity is what validate read from the files and flags.
type loadedSecurity struct {
	grpcTLS, metricsTLS *tls.Config
	allowed, admin      []authz.Pattern
}

func (s *securityFlags) register(fs *flag.FlagSet) {
	s.loaded = &loadedSecurity{}
	fs.StringVar(&s.TLSCert, "tls-cert", "", "PEM certificate the gRPC (and metrics) port serves; re-read when the file changes")
	fs.StringVar(&s.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&s.TLSClientCA, "tls-client-ca", "", "PEM CA bundle: clients must present a certificate signed by it (mutual TLS; leases are bound to the caller's identity)")
	fs.StringVar(&s.Allowed, "tls-allowed-identities", "", "comma list of identity patterns (cn:NAME, dns:NAME, uri:NAME; globs * ? [..]) allowed to call the RangeService; empty: any verified certificate")
	fs.StringVar(&s.Admin, "tls-admin-identities", "", "comma list of identity patterns allowed to call the admin RPCs (and the RangeService); empty: nobody")
	fs.StringVar(&s.MetricsClientCA, "metrics-client-ca", "", "PEM CA bundle: the metrics port requires client certificates signed by it (needs --tls-cert)")
	fs.IntVar(&s.MaxCodesPerIdentity, "max-codes-per-identity", store.DefaultMaxCodesPerIdentity, "worker codes one client identity may hold at once (1..256; mutual TLS only)")
	fs.BoolVar(&s.Insecure, "insecure", false, "allow a non-loopback --listen, --http or --metrics without mutual TLS (--tls-client-ca), or a non-loopback embedded etcd URL: anyone who reaches such a port can take every code")
	fs.StringVar(&s.Etcd.CACert, "etcd-cacert", "", "PEM CA bundle verifying the external etcd's certificate (with --etcd)")
	fs.StringVar(&s.Etcd.Cert, "etcd-cert", "", "PEM client certificate for etcd (with --etcd)")
	fs.StringVar(&s.Etcd.Key, "etcd-key", "", "PEM private key of --etcd-cert")
	fs.StringVar(&s.Etcd.User, "etcd-user", "", "etcd user (with --etcd-password-file)")
	fs.StringVar(&s.Etcd.PasswordFile, "etcd-password-file", "", "file whose first line is --etcd-user's password")
}

// validate checks and loads the flags; listen, metrics and httpAPI are the
// listen addresses, etcd the --etcd endpoints (none: the embedded etcd).
// Errors name the flag.
func (s securityFlags) validate(listen, metrics, httpAPI string, etcd []string) error {
	external := len(etcd) > 0
	l := &loadedSecurity{}
	if s.TLSCert != "" || s.TLSKey != "" {
		tc, err := tlsfiles.Files{Cert: s.TLSCert, Key: s.TLSKey, CA: s.TLSClientCA}.ServerConfig()
		if err != nil {
			return tlsFlagError(err, "--tls-cert", "--tls-key", "--tls-client-ca")
		}
		l.grpcTLS = tc
		mc, err := tlsfiles.Files{Cert: s.TLSCert, Key: s.TLSKey, CA: s.MetricsClientCA}.ServerConfig()
		if err != nil {
			return tlsFlagError(err, "--tls-cert", "--tls-key", "--metrics-client-ca")
		}
		l.metricsTLS = mc
	} else {
		switch {
		case s.TLSClientCA != "":
			return errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		case s.MetricsClientCA != "":
			return errors.New("--metrics-client-ca needs --tls-cert and --tls-key")
		}
	}
	if err := s.checkExposure(listen, metrics, httpAPI); err != nil {
		return err
	}
	var err error
	if l.allowed, err = authz.ParsePatterns("--tls-allowed-identities", cli.SplitList(s.Allowed)); err != nil {
		return err
	}
	if l.admin, err = authz.ParsePatterns("--tls-admin-identities", cli.SplitList(s.Admin)); err != nil {
		return err
	}
	if s.TLSClientCA == "" && len(l.allowed)+len(l.admin) > 0 {
		return errors.New("--tls-allowed-identities and --tls-admin-identities need mutual TLS (--tls-client-ca)")
	}
	if s.MaxCodesPerIdentity < 1 || s.MaxCodesPerIdentity > 256 {
		return errors.Newf("--max-codes-per-identity %d not in 1..256", s.MaxCodesPerIdentity)
	}
	if e := s.Etcd; !external && e.CACert+e.Cert+e.Key+e.User+e.PasswordFile != "" {
		return errors.New("--etcd-cacert, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file are for an external etcd (--etcd)")
	}
	if external {
		if err := s.checkEtcdDowngrade(etcd); err != nil {
			return err
		}
		if _, err := s.Etcd.Config(); err != nil {
			return err // names the flag
		}
	}
	if s.loaded != nil {
		*s.loaded = *l
	}
	return nil
}

// checkExposure refuses a non-loopback port that does not authenticate
// its callers, unless --insecure: without --tls-client-ca anyone who
// reaches --listen or --http can lease (and release, and fence) every code,
// whether or not the port serves TLS; --metrics counts as authenticated
// with either CA (it serves no leases, but says which codes are in use).
func (s securityFlags) checkExposure(listen, metrics, httpAPI string) error {
	if s.Insecure || s.TLSClientCA != "" {
		return nil
	}
	for _, p := range []struct{ flag, addr string }{{"--listen", listen}, {"--http", httpAPI}, {"--metrics", metrics}} {
		switch {
		case p.addr == "" || loopback(p.addr):
		case p.flag == "--metrics" && s.MetricsClientCA != "":
		case p.flag == "--metrics":
			return errors.Newf("--metrics %s is not a loopback address and nothing authenticates its callers: add --tls-client-ca (mutual TLS), or --metrics-client-ca for this port, or --insecure to accept that", p.addr)
		case s.TLSCert == "":
			return errors.Newf("%s %s is not a loopback address: serving plaintext there needs --insecure (or mutual TLS: --tls-cert, --tls-key, --tls-client-ca)", p.flag, p.addr)
		default:
			return errors.Newf("%s %s is not a loopback address: TLS without client certificates lets anyone who reaches it lease every code; add --tls-client-ca (mutual TLS), or --insecure to accept that", p.flag, p.addr)
		}
	}
	return nil
}

// checkEtcdDowngrade refuses an http:// --etcd endpoint together with an
// etcd TLS or auth flag: the etcd client drops TLS for http:// endpoints
// without a word, and would send the password in clear text. (A bare
// host:port uses TLS when a TLS flag is set.)
func (s securityFlags) checkEtcdDowngrade(endpoints []string) error {
	var set []string
	for _, f := range []struct{ name, value string }{
		{etcdclient.FlagCACert, s.Etcd.CACert}, {etcdclient.FlagCert, s.Etcd.Cert}, {etcdclient.FlagKey, s.Etcd.Key},
		{etcdclient.FlagUser, s.Etcd.User}, {etcdclient.FlagPasswordFile, s.Etcd.PasswordFile},
	} {
		if f.value != "" {
			set = append(set, f.name)
		}
	}
	return plaintextEndpoint("--etcd", endpoints, set)
}

// plaintextEndpoint refuses an http:// endpoint among endpoints (of
// flag) when TLS or auth flags are set: the etcd client would drop TLS
// for it without a word.
func plaintextEndpoint(flag string, endpoints, set []string) error {
	if len(set) == 0 {
		return nil
	}
	for _, e := range endpoints {
		if strings.HasPrefix(strings.ToLower(e), "http://") {
			return errors.Newf("%s %s with %s: an http:// endpoint makes the etcd client drop TLS without a word (and send any password in clear text); use https://%s, or a bare host:port",
				flag, e, strings.Join(set, ", "), e[len("http://"):])
		}
	}
	return nil
}

// tlsFlagError names the flag of a tlsfiles error.
func tlsFlagError(err error, cert, key, ca string) error {
	var fe *tlsfiles.FileError
	if errors.As(err, &fe) {
		flag := map[string]string{"cert": cert, "key": key, "ca": ca}[fe.Role]
		return errors.Newf("%s: %v", flag, err)
	}
	return err
}

// loopback reports whether host:port listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// applyReplica sets the replica's TLS, identities and cap.
func (s securityFlags) applyReplica(rc *region.ReplicaConfig) {
	rc.Store.MaxCodesPerIdentity = s.MaxCodesPerIdentity
	if s.loaded == nil {
		return
	}
	rc.TLS = s.loaded.grpcTLS
	rc.AllowedIdentities, rc.AdminIdentities = s.loaded.allowed, s.loaded.admin
}

// metricsListener serves the metrics port over TLS when gRPC is.
func (s securityFlags) metricsListener(l net.Listener) net.Listener {
	if s.loaded == nil || s.loaded.metricsTLS == nil {
		return l
	}
	return tls.NewListener(l, s.loaded.metricsTLS)
}

// openEtcd connects to the external etcd with the security flags.
// httpListener wraps the HTTP/JSON API's listener with the gRPC port's TLS
// configuration (the same certificate and, with --tls-client-ca, the same
// required client certificates), so that port is never the weaker door.
func (s securityFlags) httpListener(l net.Listener) net.Listener {
	if s.loaded == nil || s.loaded.grpcTLS == nil {
		return l
	}
	return tls.NewListener(l, s.loaded.grpcTLS)
}

func (s securityFlags) openEtcd(ctx context.Context, endpoints []string, timeout time.Duration, prefix string) (*clientv3.Client, error) {
	o := s.Etcd
	o.Endpoints, o.DialTimeout, o.Prefix = endpoints, timeout, prefix
	return etcdclient.Open(ctx, o)
}

// logMode says at start how the ports are secured.
func (s securityFlags) logMode(log *slog.Logger) {
	switch {
	case s.TLSCert == "":
		log.Warn("serving plaintext (no --tls-cert): anyone who can reach the port can lease and release codes", "insecure", s.Insecure)
	case s.TLSClientCA == "":
		log.Info("serving TLS without client certificates: leases are not bound to identities")
	default:
		log.Info("serving mutual TLS: leases are bound to the caller's identity",
			"allowed", s.Allowed, "admin", s.Admin, "max_codes_per_identity", s.MaxCodesPerIdentity)
	}
}

// clientTLSFlags are the TLS flags of the client commands (mint, and the
// admin commands): --tls-cert, --tls-key, --tls-ca, --tls-server-name.
type clientTLSFlags struct {
	Cert, Key, CA, ServerName string
}

func (c *clientTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Cert, "tls-cert", "", "PEM client certificate (mutual TLS); re-read when the file changes")
	fs.StringVar(&c.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&c.CA, "tls-ca", "", "PEM CA bundle verifying the service's certificate (default: the system roots); any --tls-* flag turns TLS on")
	fs.StringVar(&c.ServerName, "tls-server-name", "", "name to verify the service's certificate against (default: the target's host)")
}

// config is the client TLS configuration, nil (plaintext) when no flag is
// set. Errors are usage errors naming the flag.
func (c clientTLSFlags) config() (*tls.Config, error) {
	if c == (clientTLSFlags{}) {
		return nil, nil
	}
	tc, err := tlsfiles.Files{Cert: c.Cert, Key: c.Key, CA: c.CA, ServerName: c.ServerName}.ClientConfig()
	if err != nil {
		return nil, cli.UsageError{Err: tlsFlagError(err, "--tls-cert", "--tls-key", "--tls-ca")}
	}
	return tc, nil
}
