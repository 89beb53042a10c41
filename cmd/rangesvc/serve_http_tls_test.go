package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// The HTTP/JSON API of a mutual-TLS replica is no weaker door than its gRPC
// port: it serves the same certificate, requires a client certificate, and
// applies the same identity rules (the transcoded call carries the
// caller's verified certificate).
func TestHTTPAPIOverMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	p := newTestPKI(t, "minter-1", "stranger")
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 1, Args: p.serverFlags(
		"--tls-allowed-identities", "cn:minter-*",
	)})
	if srv.HTTPAddr == "" {
		t.Fatalf("no HTTP API address in the log:\n%s", srv.Stderr())
	}
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(p.ca)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA file: %v", err)
	}
	client := func(cn string) *http.Client {
		tc := &tls.Config{RootCAs: pool}
		if cn != "" {
			kp, err := tls.LoadX509KeyPair(p.clients[cn].Cert, p.clients[cn].Key)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{kp}
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	url := "https://" + srv.HTTPAddr + "/v1/ids?count=5"

	resp, err := client("minter-1").Get(url)
	if err != nil {
		t.Fatalf("allowed identity: %v", err)
	}
	var ok struct{ IDs []string }
	err = json.NewDecoder(resp.Body).Decode(&ok)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(ok.IDs) != 5 {
		t.Fatalf("allowed identity: %d, %+v, %v; want 200 and 5 IDs", resp.StatusCode, ok, err)
	}

	resp, err = client("stranger").Get(url)
	if err != nil {
		t.Fatalf("identity not allowed: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "allowed identity") {
		t.Fatalf("identity not allowed: %d %s; want 403 naming the allowed identities", resp.StatusCode, body)
	}

	if resp, err := client("").Get(url); err == nil {
		resp.Body.Close()
		t.Fatalf("no client certificate: %d; want the TLS handshake refused", resp.StatusCode)
	}
	if resp, err := http.Get("http://" + srv.HTTPAddr + "/v1/ids?count=1"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("the HTTP API answered plain HTTP on a mutual-TLS replica")
		}
	}
}
