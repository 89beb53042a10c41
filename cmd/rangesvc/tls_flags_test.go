package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/etcdclient/etcdclienttest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/testing/testpki"
)

// testPKI writes a CA, a server certificate and client certificates for
// the given CNs into a temporary directory.
type testPKI struct {
	dir     string
	ca      string
	server  testpki.Files
	clients map[string]testpki.Files
}

func newTestPKI(t *testing.T, clientCNs ...string) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), clients: map[string]testpki.Files{}}
	ca, err := testpki.NewCA("rangesvc test CA")
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = ca.WriteFile(p.dir, "ca.crt"); err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("rangesvc")
	if err != nil {
		t.Fatal(err)
	}
	if p.server, err = srv.WriteFiles(p.dir, "server"); err != nil {
		t.Fatal(err)
	}
	for _, cn := range clientCNs {
		c, err := ca.Client(testpki.Identity{CN: cn})
		if err != nil {
			t.Fatal(err)
		}
		if p.clients[cn], err = c.WriteFiles(p.dir, cn); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// serverFlags are the serve flags for mutual TLS with p's server
// certificate and CA, followed by more.
func (p *testPKI) serverFlags(more ...string) []string {
	return append([]string{"--tls-cert", p.server.Cert, "--tls-key", p.server.Key, "--tls-client-ca", p.ca}, more...)
}

// clientFlags are the client flags (mint, admin) for p's CA and the
// certificate of client cn.
func (p *testPKI) clientFlags(cn string) []string {
	return []string{"--tls-ca", p.ca, "--tls-cert", p.clients[cn].Cert, "--tls-key", p.clients[cn].Key}
}

// Bad security flags exit 2 with a message naming the flag, before
// anything starts.
func TestSecurityBadFlags(t *testing.T) {
	p := newTestPKI(t, "c")
	empty := filepath.Join(p.dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(p.dir, "missing.pem")
	serve := []string{"serve", "--region", "0"}
	tlsArgs := []string{"--tls-cert", p.server.Cert, "--tls-key", p.server.Key}
	ext := []string{"--etcd", "127.0.0.1:2379"}
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{join(serve, []string{"--tls-cert", p.server.Cert, "--tls-key", missing}), "--tls-key: tls key file " + missing},
		{join(serve, []string{"--tls-cert", empty, "--tls-key", p.server.Key}), "--tls-cert: tls cert file " + empty + ": holds no PEM certificate"},
		{join(serve, []string{"--tls-cert", p.server.Cert}), "--tls-key"},
		{join(serve, tlsArgs, []string{"--tls-client-ca", empty}), "--tls-client-ca: tls ca file " + empty + ": holds no PEM certificate"},
		{join(serve, tlsArgs, []string{"--tls-client-ca", p.ca, "--tls-allowed-identities", "cn:a,bogus"}), `--tls-allowed-identities: pattern "bogus"`},
		{join(serve, tlsArgs, []string{"--tls-client-ca", p.ca, "--tls-admin-identities", "uri:x/["}), `--tls-admin-identities: pattern "uri:x/["`},
		{join(serve, tlsArgs, []string{"--tls-allowed-identities", "cn:a"}), "need mutual TLS (--tls-client-ca)"},
		{join(serve, []string{"--tls-client-ca", p.ca}), "--tls-client-ca needs --tls-cert"},
		{join(serve, tlsArgs, []string{"--metrics-client-ca", empty}), "--metrics-client-ca: tls ca file"},
		{join(serve, []string{"--listen", "0.0.0.0:0"}), "--listen 0.0.0.0:0 is not a loopback address: serving plaintext there needs --insecure"},
		{join(serve, []string{"--metrics", ":0"}), "--metrics :0 is not a loopback address"},
		{join(serve, []string{"--max-codes-per-identity", "0"}), "--max-codes-per-identity 0 not in 1..256"},
		{join(serve, []string{"--etcd-user", "u"}), "for an external etcd (--etcd)"},
		{join(serve, ext, []string{"--etcd-user", "u"}), "--etcd-password-file: required with --etcd-user"},
		{join(serve, ext, []string{"--etcd-user", "u", "--etcd-password-file", missing}), "--etcd-password-file: " + missing},
		{join(serve, ext, []string{"--etcd-password-file", p.ca}), "--etcd-user: required"},
		{join(serve, ext, []string{"--etcd-cert", p.server.Cert, "--etcd-key", missing}), "--etcd-key: tls key file " + missing},
		{join(serve, ext, []string{"--etcd-cacert", empty}), "--etcd-cacert: tls ca file " + empty},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--tls-ca", empty}, "--tls-ca: tls ca file " + empty},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--tls-cert", p.clients["c"].Cert}, "--tls-key"},
		{[]string{"mint", "--target", "127.0.0.1:1", "-n", "1", "--tls-cert", p.clients["c"].Cert, "--tls-key", missing}, "--tls-key: tls key file " + missing},
	} {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			code, out, errs := runCmd(tc.args...)
			if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d saying %q", code, out, errs, cli.ExitUsage, tc.msg)
			}
		})
	}
}

// No silent downgrade (issue 24): an http:// --etcd endpoint with an etcd
// TLS or auth flag (the client would drop TLS and send the password in
// clear text), and a non-loopback port without mutual TLS unless
// --insecure, exit 2 naming the flags and the fix; the secure forms and
// an explicit --insecure parse.
func TestNoSilentDowngrade(t *testing.T) {
	p := newTestPKI(t, "etcd-client")
	pw := filepath.Join(p.dir, "password")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	etcdTLS := []string{"--etcd-cacert", p.ca, "--etcd-cert", p.clients["etcd-client"].Cert, "--etcd-key", p.clients["etcd-client"].Key}
	etcdAuth := []string{"--etcd-user", "idrange", "--etcd-password-file", pw}
	serverTLS := []string{"--tls-cert", p.server.Cert, "--tls-key", p.server.Key}
	args := func(parts ...[]string) []string {
		out := []string{"--region", "1"}
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		args []string
		msg  string // "" when the flags are accepted
	}{
		{args([]string{"--etcd", "http://127.0.0.1:2379"}, etcdTLS),
			"--etcd http://127.0.0.1:2379 with --etcd-cacert, --etcd-cert, --etcd-key: an http:// endpoint makes the etcd client drop TLS"},
		{args([]string{"--etcd", "127.0.0.1:2379,HTTP://127.0.0.2:2379"}, etcdAuth),
			"--etcd HTTP://127.0.0.2:2379 with --etcd-user, --etcd-password-file: an http:// endpoint makes the etcd client drop TLS without a word (and send any password in clear text); use https://127.0.0.2:2379"},
		{args([]string{"--etcd", "http://127.0.0.1:2379", "--etcd-cacert", p.ca}), "--etcd http://127.0.0.1:2379 with --etcd-cacert:"},
		{args([]string{"--etcd", "https://127.0.0.1:2379,127.0.0.2:2379"}, etcdTLS, etcdAuth), ""},
		{args([]string{"--etcd", "http://127.0.0.1:2379"}), ""}, // plaintext, and nothing says otherwise

		{args(serverTLS, []string{"--listen", "0.0.0.0:0"}), "--listen 0.0.0.0:0 is not a loopback address: TLS without client certificates lets anyone who reaches it lease every code; add --tls-client-ca (mutual TLS), or --insecure"},
		{args(serverTLS, []string{"--http", "[::]:0"}), "--http [::]:0 is not a loopback address: TLS without client certificates"},
		{args(serverTLS, []string{"--metrics", ":0"}), "--metrics :0 is not a loopback address and nothing authenticates its callers: add --tls-client-ca (mutual TLS), or --metrics-client-ca for this port, or --insecure"},
		{args([]string{"--metrics", "10.1.2.3:0"}), "--metrics 10.1.2.3:0 is not a loopback address and nothing authenticates its callers"},
		{args([]string{"--http", "10.1.2.3:7071"}), "--http 10.1.2.3:7071 is not a loopback address: serving plaintext there needs --insecure (or mutual TLS: --tls-cert, --tls-key, --tls-client-ca)"},
		{args(serverTLS, []string{"--listen", "0.0.0.0:0", "--insecure"}), ""},
		{args(serverTLS, []string{"--listen", "0.0.0.0:0", "--http", "0.0.0.0:0", "--metrics", "0.0.0.0:0", "--tls-client-ca", p.ca}), ""},
		{args(serverTLS, []string{"--metrics", "0.0.0.0:0", "--metrics-client-ca", p.ca}), ""},
		{args(serverTLS, []string{"--listen", "0.0.0.0:0", "--metrics-client-ca", p.ca}), "--listen 0.0.0.0:0 is not a loopback address"},
	} {
		t.Run(strings.Join(tc.args[2:], " "), func(t *testing.T) {
			if tc.msg != "" {
				// Bounded, and off the default data dir and etcd ports, in
				// case the flags are wrongly accepted and serve starts.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				var stdout, stderr bytes.Buffer
				cmd := []string{"serve", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--http", "127.0.0.1:0"}
				if !slices.Contains(tc.args, "--etcd") {
					cmd = append(cmd, "--data-dir", t.TempDir(), "--etcd-client-url", "https://127.0.0.1:0", "--etcd-peer-url", "https://127.0.0.1:0")
				}
				code := run(ctx, append(cmd, tc.args...), &stdout, &stderr)
				out, errs := stdout.String(), stderr.String()
				if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
					t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d saying %q", code, out, errs, cli.ExitUsage, tc.msg)
				}
				return
			}
			if _, err := parseServeFlags(tc.args, io.Discard); err != nil {
				t.Fatalf("parse: %v, want the flags accepted", err)
			}
		})
	}
}

// mintCmd runs `rangesvc mint` with args and returns its exit code, stdout
// and stderr.
func mintCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Binary(t), append([]string{"mint"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), stdout.String(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stdout.String(), stderr.String()
}

// serve over mutual TLS, and mint with a client certificate: an allowed
// identity mints, a plaintext mint and an identity that is not allowed
// fail (exit 1) without minting.
func TestServeMintOverMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	p := newTestPKI(t, "minter-1", "stranger")
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 3, Args: p.serverFlags(
		"--tls-allowed-identities", "cn:minter-*", "--max-codes-per-identity", "2",
	)})
	if !strings.Contains(srv.Stderr(), "serving mutual TLS") {
		t.Fatalf("the log does not say how the port is secured:\n%s", srv.Stderr())
	}
	// The metrics/health port serves HTTPS with the same certificate.
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(p.ca)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA file: %v", err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + srv.MetricsAddr + "/healthz")
	if err != nil {
		t.Fatalf("healthz over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "SERVING" {
		t.Fatalf("healthz over HTTPS: %d %q", resp.StatusCode, body)
	}
	if resp, err := http.Get("http://" + srv.MetricsAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("the metrics port answered plain HTTP")
		}
	}
	client := func(cn string) []string {
		return append([]string{"--target", srv.GRPCAddr, "-n", "1000", "--timeout", "5s"}, p.clientFlags(cn)...)
	}
	code, out, errs := mintCmd(t, client("minter-1")...)
	if code != 0 || strings.Count(out, "\n") != 1000 {
		t.Fatalf("allowed identity: exit %d, %d lines, stderr %s", code, strings.Count(out, "\n"), errs)
	}
	for _, line := range strings.Fields(out)[:3] {
		if _, err := strconv.ParseInt(line, 10, 64); err != nil {
			t.Fatalf("not an ID: %q", line)
		}
	}
	code, out, errs = mintCmd(t, client("stranger")...)
	if code != 1 || out != "" || !strings.Contains(errs, "matches no allowed identity") {
		t.Fatalf("identity not allowed: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	t.Logf("identity not allowed: %s", lastLine(errs))
	code, out, errs = mintCmd(t, "--target", srv.GRPCAddr, "-n", "1", "--timeout", "3s")
	if code != 1 || out != "" {
		t.Fatalf("plaintext mint: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	t.Logf("plaintext: %s", lastLine(errs))
}

// serve against an etcd that requires client certificates and a user:
// with the right options it serves and mints; a wrong password or a
// missing client certificate exits 1 with one line naming the problem.
func TestServeSecureEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	e := etcdclienttest.Start(t)
	o := e.Options()
	args := []string{"--etcd-cacert", o.CACert, "--etcd-cert", o.Cert, "--etcd-key", o.Key,
		"--etcd-user", o.User, "--etcd-password-file", o.PasswordFile}
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 1, Etcd: []string{strings.TrimPrefix(e.Endpoint, "https://")}, Args: args})
	testenv.Mint(t, []string{srv.GRPCAddr}, 1, 100) // checks them: 100, distinct, of region 1, dated now

	wrong := filepath.Join(e.Dir, "wrong-password")
	if err := os.WriteFile(wrong, []byte("guess\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"wrong password", []string{"--etcd-cacert", o.CACert, "--etcd-cert", o.Cert, "--etcd-key", o.Key,
			"--etcd-user", o.User, "--etcd-password-file", wrong}, "authentication failed"},
		{"no client certificate", []string{"--etcd-cacert", o.CACert,
			"--etcd-user", o.User, "--etcd-password-file", o.PasswordFile}, "does it accept this client's TLS certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, testenv.Binary(t), append([]string{"serve", "--region", "1",
				"--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--etcd-timeout", "2s",
				"--etcd", strings.TrimPrefix(e.Endpoint, "https://")}, tc.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 1 {
				t.Fatalf("exit %v, want 1; stderr %s", err, stderr.String())
			}
			last := lastLine(stderr.String())
			t.Logf("%s: %s", tc.name, last)
			if !strings.Contains(last, tc.msg) || strings.Contains(stderr.String(), "guess") {
				t.Fatalf("last stderr line %q does not say %q (or shows the password)", last, tc.msg)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
