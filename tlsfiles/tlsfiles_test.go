package tlsfiles_test

import (
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/testing/testpki"
	"github.com/idrange/idrange/tlsfiles"
)

type pki struct {
	dir    string
	ca     *testpki.CA
	caFile string
	srv    testpki.Files
	cli    testpki.Files
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	var err error
	if p.ca, err = testpki.NewCA("test ca"); err != nil {
		t.Fatal(err)
	}
	if p.caFile, err = p.ca.WriteFile(p.dir, "ca.crt"); err != nil {
		t.Fatal(err)
	}
	p.srv = p.issueServer(t, "server one")
	cli, err := p.ca.Client(testpki.Identity{CN: "client a"})
	if err != nil {
		t.Fatal(err)
	}
	if p.cli, err = cli.WriteFiles(p.dir, "client"); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pki) issueServer(t *testing.T, cn string) testpki.Files {
	t.Helper()
	c, err := p.ca.Server(cn)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.WriteFiles(p.dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// handshake runs one TLS handshake between the configs over loopback and
// returns the server certificate's CN and the client certificate's CN the
// server saw ("" if none), or the first error.
func handshake(t *testing.T, srvCfg, cliCfg *tls.Config) (serverCN, clientCN string, err error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type result struct {
		cn  string
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			got <- result{err: err}
			return
		}
		var cn string
		if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
			cn = pc[0].Subject.CommonName
		}
		got <- result{cn: cn}
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), cliCfg)
	if err != nil {
		return "", "", err
	}
	defer conn.Close()
	serverCN = conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	// TLS 1.3: the server's verdict on the client certificate arrives
	// after the client's handshake; wait for it.
	r := <-got
	return serverCN, r.cn, r.err
}

func TestMutualTLSAndRotation(t *testing.T) {
	p := newPKI(t)
	var reloads []error
	srvCfg, err := tlsfiles.Files{Cert: p.srv.Cert, Key: p.srv.Key, CA: p.caFile,
		OnReload: func(err error) { reloads = append(reloads, err) }}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	cliCfg, err := tlsfiles.Files{Cert: p.cli.Cert, Key: p.cli.Key, CA: p.caFile, ServerName: "localhost"}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	srvCN, cliCN, err := handshake(t, srvCfg, cliCfg)
	if err != nil || srvCN != "server one" || cliCN != "client a" {
		t.Fatalf("handshake: server %q client %q err %v", srvCN, cliCN, err)
	}

	// Half a rotation (new certificate, old key): the old pair is kept.
	c2, err := p.ca.Server("server two")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.srv.Cert, c2.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if srvCN, _, err = handshake(t, srvCfg, cliCfg); err != nil || srvCN != "server one" {
		t.Fatalf("after half a rotation: server %q err %v, want the old pair", srvCN, err)
	}
	if len(reloads) != 1 || reloads[0] == nil || !strings.Contains(reloads[0].Error(), p.srv.Key) {
		t.Fatalf("reload reports %v, want one error naming the key file", reloads)
	}
	// The rest of the rotation: the new pair is served.
	if err := os.WriteFile(p.srv.Key, c2.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if srvCN, _, err = handshake(t, srvCfg, cliCfg); err != nil || srvCN != "server two" {
		t.Fatalf("after the rotation: server %q err %v", srvCN, err)
	}
	if len(reloads) != 2 || reloads[1] != nil {
		t.Fatalf("reload reports %v, want an error then nil", reloads)
	}

	// A client without a certificate is refused by the mTLS server.
	anon, err := tlsfiles.Files{CA: p.caFile}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := handshake(t, srvCfg, anon); err == nil {
		t.Fatal("client without a certificate: handshake succeeded")
	}
}

func TestBadFiles(t *testing.T) {
	p := newPKI(t)
	empty := filepath.Join(p.dir, "empty.pem")
	garbage := filepath.Join(p.dir, "garbage.pem")
	if err := os.WriteFile(empty, []byte("no pem here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(p.dir, "missing.key")
	for _, tc := range []struct {
		name     string
		files    tlsfiles.Files
		client   bool
		role     string
		path     string
		contains string
	}{
		{"missing key file", tlsfiles.Files{Cert: p.srv.Cert, Key: missing}, false, "key", missing, "no such file"},
		{"cert without PEM", tlsfiles.Files{Cert: empty, Key: p.srv.Key}, false, "cert", empty, "no PEM certificate"},
		{"cert that does not parse", tlsfiles.Files{Cert: garbage, Key: p.srv.Key}, false, "cert", garbage, "does not parse"},
		{"key of another certificate", tlsfiles.Files{Cert: p.srv.Cert, Key: p.cli.Key}, false, "key", p.cli.Key, "match"},
		{"CA without a certificate", tlsfiles.Files{Cert: p.srv.Cert, Key: p.srv.Key, CA: empty}, false, "ca", empty, "no PEM certificate"},
		{"server without key", tlsfiles.Files{Cert: p.srv.Cert}, false, "key", "", "not set"},
		{"client cert without key", tlsfiles.Files{Cert: p.cli.Cert}, true, "key", "", "not set"},
		{"client CA missing", tlsfiles.Files{CA: missing}, true, "ca", missing, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.client {
				_, err = tc.files.ClientConfig()
			} else {
				_, err = tc.files.ServerConfig()
			}
			var fe *tlsfiles.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a *FileError", err)
			}
			msg := err.Error()
			if fe.Role != tc.role || fe.Path != tc.path || !strings.Contains(msg, tc.contains) ||
				strings.Contains(msg, "\n") || (tc.path != "" && strings.Count(msg, tc.path) != 1) {
				t.Fatalf("err = %q (role %q path %q), want role %q, path %q named once, %q", msg, fe.Role, fe.Path, tc.role, tc.path, tc.contains)
			}
		})
	}
}

// A client's certificate is re-read too: after the files change, the next
// handshake presents the new one.
func TestClientCertificateRotation(t *testing.T) {
	p := newPKI(t)
	srvCfg, err := tlsfiles.Files{Cert: p.srv.Cert, Key: p.srv.Key, CA: p.caFile}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	cliCfg, err := tlsfiles.Files{Cert: p.cli.Cert, Key: p.cli.Key, CA: p.caFile, ServerName: "localhost"}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, cn, err := handshake(t, srvCfg, cliCfg); err != nil || cn != "client a" {
		t.Fatalf("before rotation: client %q, %v", cn, err)
	}
	next, err := p.ca.Client(testpki.Identity{CN: "client a, renewed"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.WriteFiles(p.dir, "client"); err != nil {
		t.Fatal(err)
	}
	if _, cn, err := handshake(t, srvCfg, cliCfg); err != nil || cn != "client a, renewed" {
		t.Fatalf("after rotation: client %q, %v", cn, err)
	}
}
