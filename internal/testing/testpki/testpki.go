// Package testpki makes throw-away X.509 PKIs for tests: a CA, server
// certificates for the loopback names (127.0.0.1, ::1, localhost) and client
// certificates carrying a CN, a DNS SAN or a URI SAN, written as PEM files.
// Only tests import it; it does not import testing, so helpers in other test
// packages can use it too.
//
//	ca, _ := testpki.NewCA("test CA")
//	srv, _ := ca.Server("replica")
//	cli, _ := ca.Client(testpki.Identity{URI: "spiffe://idrange.test/minter/a"})
//	files, _ := srv.WriteFiles(dir, "server") // server.crt, server.key
//
// Keys are ECDSA P-256 (fast to generate); certificates are valid from an
// hour ago for a day.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/errors"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// Cert is a certificate and its key, signed by a CA.
type Cert struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	KeyPEM  []byte
}

// Identity is what a client certificate names: any of CommonName, one DNS
// SAN and one URI SAN (empty fields are left out).
type Identity struct {
	CN  string
	DNS string
	URI string
}

// NewCA returns a new self-signed CA named cn.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Newf("testpki: CA key: %w", err)
	}
	tmpl := template(pkix.Name{CommonName: cn})
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, errors.Newf("testpki: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errors.Newf("testpki: CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// WriteFile writes the CA certificate to dir/name and returns its path.
func (ca *CA) WriteFile(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, ca.PEM, 0o600); err != nil {
		return "", errors.Newf("testpki: %w", err)
	}
	return p, nil
}

// Server issues a server certificate named cn for 127.0.0.1, ::1 and
// localhost (usable for client auth too, as etcd peers need).
func (ca *CA) Server(cn string) (*Cert, error) {
	tmpl := template(pkix.Name{CommonName: cn})
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

// Client issues a client certificate naming id.
func (ca *CA) Client(id Identity) (*Cert, error) {
	tmpl := template(pkix.Name{CommonName: id.CN})
	if id.DNS != "" {
		tmpl.DNSNames = []string{id.DNS}
	}
	if id.URI != "" {
		u, err := url.Parse(id.URI)
		if err != nil {
			return nil, errors.Newf("testpki: URI SAN %q: %w", id.URI, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

func (ca *CA) issue(tmpl *x509.Certificate) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Newf("testpki: key: %w", err)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, errors.Newf("testpki: certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errors.Newf("testpki: certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, errors.Newf("testpki: key: %w", err)
	}
	return &Cert{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
	}, nil
}

// TLS is the certificate as a tls.Certificate (for in-memory configs).
func (c *Cert) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.Cert.Raw}, PrivateKey: c.Key, Leaf: c.Cert}
}

// Files are the paths WriteFiles wrote.
type Files struct {
	Cert, Key string
}

// WriteFiles writes dir/<name>.crt and dir/<name>.key (replacing them
// atomically by rename, as a certificate manager rotating them would).
func (c *Cert) WriteFiles(dir, name string) (Files, error) {
	f := Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	if err := writeAtomic(f.Key, c.KeyPEM); err != nil {
		return Files{}, err
	}
	if err := writeAtomic(f.Cert, c.CertPEM); err != nil {
		return Files{}, err
	}
	return f, nil
}

func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".testpki-*")
	if err != nil {
		return errors.Newf("testpki: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return errors.Newf("testpki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return errors.Newf("testpki: %w", err)
	}
	return nil
}

func template(subject pkix.Name) *x509.Certificate {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil { // crypto/rand does not fail on supported platforms
		panic(fmt.Sprintf("testpki: serial: %v", err))
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}
}
