// Package embedetcdtest starts embedded etcd servers for tests: quiet, in
// t.TempDir(), on random loopback ports, with raft timings for a busy
// machine, stopped by t.Cleanup. It is kept out of package embedetcd so that
// the server binary, which imports embedetcd, does not link package testing.
package embedetcdtest

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/tlsfiles"
)

// StartTimeout bounds Start and StartConfig.
const StartTimeout = 60 * time.Second

// Start starts a quiet embedded etcd in t.TempDir() on random loopback
// ports with embedetcd.BusyTickMs/BusyElectionMs, and stops it at the end
// of the test. It fails the test if etcd does not start.
func Start(t testing.TB) *embedetcd.Server {
	t.Helper()
	return StartConfig(t, embedetcd.Config{})
}

// StartConfig is Start with overrides; zero fields get Start's defaults
// (Dir = t.TempDir(), the busy raft timings, a nop logger).
func StartConfig(t testing.TB, cfg embedetcd.Config) *embedetcd.Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.TickMs == 0 && cfg.ElectionMs == 0 {
		cfg.TickMs, cfg.ElectionMs = embedetcd.BusyTickMs, embedetcd.BusyElectionMs
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	s, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("embedetcd: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Client returns a client for s that is closed at the end of the test.
// Each call returns a separate client (a separate connection), which is how
// tests model several service replicas sharing one etcd.
func Client(t testing.TB, s *embedetcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := s.NewClient(nil)
	if err != nil {
		t.Fatalf("embedetcd: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// RequireClosed fails t unless the secured member at client (its client
// URL, https://host:port) and peer (its peer URL) can be used only with a
// certificate of p's CA: a clientv3 client without a client certificate,
// one on plaintext http, and a plain HTTP request are refused, reads and
// writes alike (a refused write leaves no key behind); the peer port
// refuses a TLS client without a certificate. As a control, p's client
// certificate reads, writes and reaches the peer port (the path
// docs/operations.md gives operators).
func RequireClosed(t testing.TB, client, peer string, p embedetcd.PKI) {
	t.Helper()
	const probeKey = "/embedetcdtest/unauthenticated-write"
	hostPort := strings.TrimPrefix(client, "https://")
	if hostPort == client {
		t.Fatalf("client URL %q is not https", client)
	}
	caOnly, err := tlsfiles.Files{CA: p.CACert}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	withCert, err := tlsfiles.Files{CA: p.CACert, Cert: p.ClientCert, Key: p.ClientKey}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	open := func(ep string, tc *tls.Config) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 3 * time.Second, TLS: tc,
			Logger: zap.NewNop()})
		if err != nil {
			t.Fatalf("clientv3.New(%s): %v", ep, err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	// clientv3 retries a refused handshake until its deadline, so its
	// errors say only "deadline exceeded"; the raw handshakes below show
	// the refusal itself.
	var wg sync.WaitGroup
	for name, cli := range map[string]*clientv3.Client{
		"TLS without a client certificate": open(client, caOnly),
		"plaintext http":                   open("http://"+hostPort, nil),
	} {
		for op, call := range map[string]func(context.Context) error{
			"read":  func(ctx context.Context) error { _, err := cli.Get(ctx, "/", clientv3.WithPrefix()); return err },
			"write": func(ctx context.Context) error { _, err := cli.Put(ctx, probeKey, name); return err },
		} {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				if err := call(ctx); err == nil {
					t.Errorf("%s: a %s on %s succeeded", name, op, client)
				}
			})
		}
	}
	wg.Wait()
	for name, addr := range map[string]string{"client": hostPort, "peer": strings.TrimPrefix(peer, "https://")} {
		if err := handshake(addr, caOnly); err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("%s port %s, TLS without a client certificate: %v; want the server's \"certificate required\"", name, addr, err)
		}
		if err := handshake(addr, withCert); err != nil {
			t.Errorf("%s port %s with the client certificate: %v", name, addr, err)
		}
	}
	httpCli := &http.Client{Timeout: 5 * time.Second}
	if resp, err := httpCli.Post("http://"+hostPort+"/v3/kv/range", "application/json",
		strings.NewReader(`{"key":"AA==","range_end":"AA=="}`)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP POST /v3/kv/range on %s: %s %s", hostPort, resp.Status, b)
		}
	}
	peerGet := func(tc *tls.Config) (*http.Response, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		defer c.CloseIdleConnections()
		resp, err := c.Get(peer + "/members")
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	if resp, err := peerGet(caOnly); err == nil {
		t.Errorf("peer port %s answered a client without a certificate: %s", peer, resp.Status)
	}

	// The control: the generated client certificate works everywhere.
	cli := open(client, withCert)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := cli.Get(ctx, probeKey); err != nil {
		t.Fatalf("with the client certificate: %v", err)
	} else if len(r.Kvs) != 0 {
		t.Errorf("an unauthenticated write left %s = %q", probeKey, r.Kvs[0].Value)
	}
	if _, err := cli.Put(ctx, probeKey+"-control", "x"); err != nil {
		t.Errorf("a write with the client certificate: %v", err)
	}
	if resp, err := peerGet(withCert); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("peer port %s with the client certificate: %v %v", peer, resp, err)
	}
}

// handshake completes a TLS handshake with addr and reads once: with TLS
// 1.3 a server refuses a client certificate only after the client's side
// of the handshake is done, so the refusal arrives on the first read (a
// read that times out means the server accepted the connection).
func handshake(addr string, tc *tls.Config) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err = conn.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return nil
	}
	return err
}
