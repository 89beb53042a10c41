// Package tlsfiles builds TLS configurations from PEM files and re-reads the
// certificate and key when the files change, so a rotated certificate is
// served (or presented) on the next handshake without a restart.
//
//	srv, err := tlsfiles.Files{Cert: "server.crt", Key: "server.key", CA: "clients-ca.crt"}.ServerConfig()
//	cli, err := tlsfiles.Files{Cert: "a.crt", Key: "a.key", CA: "ca.crt"}.ClientConfig()
//
// Every handshake stats the two files (two stat calls, no reads); when the
// size, modification time or inode of either changed, the pair is read and
// parsed again. A pair that does not load (a rotation caught half-way: new
// certificate, old key) is not used: the previous pair keeps being served
// and the files are tried again at the next handshake. CA files are read
// once. The package uses only the standard library.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
)

// Files names the PEM files of one side of a TLS connection. The zero value
// of each field means "not used".
type Files struct {
	// Cert is the certificate (chain, leaf first) presented to the peer.
	// Required for a server; for a client, a certificate for mutual TLS.
	Cert string
	// Key is Cert's private key (PKCS#1, PKCS#8 or SEC 1). Required with
	// Cert.
	Key string
	// CA is a bundle of CA certificates. On a server: client certificates
	// must be signed by one of them, and a client without one is refused
	// (mutual TLS); empty accepts clients without certificates. On a
	// client: the roots that verify the server; empty uses the system's.
	CA string
	// ServerName is the name a client verifies the server's certificate
	// against, when it is not the host of the address dialled.
	ServerName string
	// OnReload, if set, is called after each attempt to re-read a changed
	// certificate or key: with nil when the new pair is in use, with the
	// error (a *FileError) when the previous pair is kept.
	OnReload func(err error)
}

// FileError is a file that could not be used. Role says which field of
// Files named it ("cert", "key" or "ca"), so a command line can name its
// flag.
type FileError struct {
	Role string
	Path string
	Err  error
}

func (e *FileError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("tls %s file: %v", e.Role, e.Err)
	}
	return fmt.Sprintf("tls %s file %s: %v", e.Role, e.Path, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// ServerConfig returns a server configuration (TLS 1.2 or later) serving
// the certificate in f.Cert/f.Key, re-read when the files change. With f.CA
// set, clients must present a certificate signed by one of its CAs
// (tls.RequireAndVerifyClientCert).
func (f Files) ServerConfig() (*tls.Config, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, f.pairMissing()
	}
	kp, err := f.keyPair()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.getCertificate}
	if f.CA != "" {
		pool, err := LoadCA(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientConfig returns a client configuration (TLS 1.2 or later) that
// verifies the server against f.CA (the system roots if empty) and
// f.ServerName, and, if f.Cert and f.Key are set, presents that
// certificate (re-read when the files change) when the server asks.
func (f Files) ClientConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pool, err := LoadCA(f.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert != "" && f.Key != "":
		kp, err := f.keyPair()
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = kp.getClientCertificate
	case f.Cert != "" || f.Key != "":
		return nil, f.pairMissing()
	}
	return cfg, nil
}

func (f Files) pairMissing() error {
	if f.Cert == "" {
		return &FileError{Role: "cert", Err: errors.New("not set (a certificate needs its key and the key its certificate)")}
	}
	return &FileError{Role: "key", Err: fmt.Errorf("not set (the certificate %s needs its key)", f.Cert)}
}

// LoadCA reads a PEM bundle of CA certificates into a pool. A file that
// holds no certificate is an error (a *FileError with Role "ca"), not an
// empty pool that would refuse every peer.
func LoadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{Role: "ca", Path: path, Err: unwrapPath(err)}
	}
	certs, err := parseCerts(b)
	if err != nil {
		return nil, &FileError{Role: "ca", Path: path, Err: err}
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts returns the certificates of a PEM bundle: at least one, and
// every CERTIFICATE block must parse.
func parseCerts(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("holds no PEM certificate")
	}
	return certs, nil
}

// unwrapPath drops the *os.PathError wrapper: FileError names the path.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// keyPair is a certificate and key loaded from files, re-loaded when they
// change.
type keyPair struct {
	files Files

	mu       sync.Mutex
	cert     *tls.Certificate
	certStat os.FileInfo
	keyStat  os.FileInfo
	// failCert and failKey are the files as they were when a reload last
	// failed: they are not tried (or reported) again until they change.
	failCert, failKey os.FileInfo
}

func (f Files) keyPair() (*keyPair, error) {
	kp := &keyPair{files: f}
	if err := kp.load(); err != nil {
		return nil, err
	}
	return kp, nil
}

// load reads and parses both files and, if they load, makes them current.
func (kp *keyPair) load() error {
	f := kp.files
	cs, err := os.Stat(f.Cert)
	if err != nil {
		return &FileError{Role: "cert", Path: f.Cert, Err: unwrapPath(err)}
	}
	ks, err := os.Stat(f.Key)
	if err != nil {
		return &FileError{Role: "key", Path: f.Key, Err: unwrapPath(err)}
	}
	cb, err := os.ReadFile(f.Cert)
	if err != nil {
		return &FileError{Role: "cert", Path: f.Cert, Err: unwrapPath(err)}
	}
	if _, err := parseCerts(cb); err != nil {
		return &FileError{Role: "cert", Path: f.Cert, Err: err}
	}
	kb, err := os.ReadFile(f.Key)
	if err != nil {
		return &FileError{Role: "key", Path: f.Key, Err: unwrapPath(err)}
	}
	// The certificate parsed, so what X509KeyPair finds wrong is the key
	// (or that it is not the certificate's).
	cert, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		return &FileError{Role: "key", Path: f.Key, Err: fmt.Errorf("%w (certificate %s)", err, f.Cert)}
	}
	kp.cert, kp.certStat, kp.keyStat = &cert, cs, ks
	return nil
}

// current returns the pair, re-reading it first if either file changed
// since it was loaded.
func (kp *keyPair) current() *tls.Certificate {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	cs, cerr := os.Stat(kp.files.Cert)
	ks, kerr := os.Stat(kp.files.Key)
	if cerr == nil && kerr == nil &&
		(same(cs, kp.certStat) && same(ks, kp.keyStat) || same(cs, kp.failCert) && same(ks, kp.failKey)) {
		return kp.cert
	}
	err := kp.load() // stat errors are reported by load too
	kp.failCert, kp.failKey = nil, nil
	if err != nil && cerr == nil && kerr == nil {
		kp.failCert, kp.failKey = cs, ks
	}
	if kp.files.OnReload != nil {
		kp.files.OnReload(err)
	}
	return kp.cert
}

func same(a, b os.FileInfo) bool {
	return b != nil && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime()) && os.SameFile(a, b)
}

func (kp *keyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return kp.current(), nil
}

func (kp *keyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return kp.current(), nil
}
