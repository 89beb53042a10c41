package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

// A client certificate verifies against its own CA and not against another.
func TestChains(t *testing.T) {
	ca, err := NewCA("ca one")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("ca two")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Client(Identity{CN: "a", DNS: "a.test", URI: "spiffe://idrange.test/a"})
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := cli.Cert.Verify(opts); err != nil {
		t.Fatalf("own CA: %v", err)
	}
	opts.Roots = other.Pool()
	if _, err := cli.Cert.Verify(opts); err == nil {
		t.Fatal("verified against another CA")
	}
	srv, err := ca.Server("replica")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	files, err := srv.WriteFiles(t.TempDir(), "server")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.LoadX509KeyPair(files.Cert, files.Key); err != nil {
		t.Fatal(err)
	}
}
