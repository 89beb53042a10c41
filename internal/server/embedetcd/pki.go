package embedetcd

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

// A secured member (https URLs) serves its client and peer listeners with
// certificates from a small PKI in its data directory, and refuses every
// connection that does not present a certificate of that PKI's CA. Start
// makes the PKI on first use and reuses it after:
//
//	<Dir>/pki/             0700
//	  ca.crt, ca.key       the CA the member trusts; kept for good, so an
//	                       operator's copy of ca.crt stays valid
//	  server.crt, .key     the client and peer listeners (names: the listen
//	                       hosts, 127.0.0.1, ::1, localhost)
//	  client.crt, .key     the replica's own etcd client, and etcdctl
//
// Keys are ECDSA P-256 in PKCS#8, mode 0600. A file that does not parse, a
// key that does not match its certificate, a certificate the CA did not
// sign, a key file others can read, or one file of a pair without the
// other fails Start naming the file: nothing is regenerated over it. Start
// (re)issues only what is missing or ending: a server or client
// certificate with less than PKIRenewBefore left, or a server certificate
// that does not name every listen host. The CA is never replaced: one with
// less than PKIRenewBefore left fails Start, saying to move the pki
// directory aside (which makes a new CA, and operators' copies of ca.crt
// must then be replaced).
const (
	// PKIDirName is the PKI's directory inside the data directory.
	PKIDirName = "pki"
	// PKICAValidity, PKILeafValidity: how long a new CA and a new server
	// or client certificate are valid (a leaf never past its CA).
	PKICAValidity   = 20 * 365 * 24 * time.Hour
	PKILeafValidity = 5 * 365 * 24 * time.Hour
	// PKIRenewBefore: Start reissues a server or client certificate with
	// less than this left, so a process started on it has at least this
	// long before it expires.
	PKIRenewBefore = 365 * 24 * time.Hour
)

// PKI names the files of a secured member's PKI (all empty for a
// plaintext member) and says what the last Start wrote.
type PKI struct {
	// Dir is <data dir>/pki.
	Dir string
	// CACert verifies the member (etcdctl --cacert); CAKey signs the
	// other two pairs.
	CACert, CAKey string
	// ServerCert and ServerKey are the member's listeners' certificate.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate the member
	// accepts (etcdctl --cert, --key; rangesvc --etcd-cert, --etcd-key).
	ClientCert, ClientKey string
	// Changes lists what the last Start made or replaced, one line each
	// ("made a new CA ca.crt", "renewed client.crt: it expired ...");
	// empty when every file was reused.
	Changes []string
}

// PKIFiles names the PKI files of a secured member on dataDir (whether or
// not they exist yet).
func PKIFiles(dataDir string) PKI {
	d := filepath.Join(dataDir, PKIDirName)
	j := func(n string) string { return filepath.Join(d, n) }
	return PKI{Dir: d, CACert: j("ca.crt"), CAKey: j("ca.key"),
		ServerCert: j("server.crt"), ServerKey: j("server.key"),
		ClientCert: j("client.crt"), ClientKey: j("client.key")}
}

// ensurePKI makes sure dataDir/pki holds a usable PKI whose server
// certificate names every host in hosts (IP addresses or DNS names), as
// of now, and returns its files.
func ensurePKI(dataDir string, hosts []string, now time.Time) (PKI, error) {
	p := PKIFiles(dataDir)
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return PKI{}, errors.Wrapf(err, "embedetcd: pki dir %s", p.Dir)
	}
	if fi, err := os.Stat(p.Dir); err != nil {
		return PKI{}, errors.Wrapf(err, "embedetcd: pki dir %s", p.Dir)
	} else if fi.Mode().Perm()&0o077 != 0 {
		return PKI{}, errors.Newf("embedetcd: pki dir %s has mode %v; want 0700 (its keys open the embedded etcd)", p.Dir, fi.Mode().Perm())
	}
	ca, err := loadPair(p.CACert, p.CAKey)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if ca, err = newCA(now); err != nil {
			return PKI{}, err
		}
		if err := ca.write(p.CACert, p.CAKey); err != nil {
			return PKI{}, err
		}
		p.Changes = append(p.Changes, "made a new CA "+p.CACert)
	case err != nil:
		return PKI{}, err
	case !ca.cert.IsCA:
		return PKI{}, errors.Newf("embedetcd: %s is not a CA certificate", p.CACert)
	case now.Add(PKIRenewBefore).After(ca.cert.NotAfter):
		return PKI{}, errors.Newf("embedetcd: CA %s expires %s: move %s aside to make a new one (then replace operators' copies of ca.crt)",
			p.CACert, ca.cert.NotAfter.UTC().Format(time.RFC3339), p.Dir)
	}
	leaves := []struct {
		cert, key string
		tmpl      *x509.Certificate
	}{
		{p.ServerCert, p.ServerKey, serverTemplate(hosts)},
		{p.ClientCert, p.ClientKey, clientTemplate()},
	}
	for _, l := range leaves {
		why, err := checkLeaf(l.cert, l.key, ca.cert, l.tmpl, now)
		if err != nil {
			return PKI{}, err
		}
		if why == "" {
			continue
		}
		leaf, err := ca.issue(l.tmpl, now)
		if err != nil {
			return PKI{}, err
		}
		if err := leaf.write(l.cert, l.key); err != nil {
			return PKI{}, err
		}
		p.Changes = append(p.Changes, why)
	}
	return p, nil
}

// checkLeaf loads a server or client pair and says why it must be
// (re)issued ("" to keep it); a pair that is there but unusable is an
// error naming the file.
func checkLeaf(certPath, keyPath string, ca *x509.Certificate, want *x509.Certificate, now time.Time) (string, error) {
	kp, err := loadPair(certPath, keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return "issued " + certPath, nil
	}
	if err != nil {
		return "", err
	}
	c := kp.cert
	if err := c.CheckSignatureFrom(ca); err != nil {
		return "", errors.Newf("embedetcd: %s is not signed by the CA of its directory: %v", certPath, err)
	}
	if now.Add(PKIRenewBefore).After(c.NotAfter) {
		return fmt.Sprintf("renewed %s: it expires %s", certPath, c.NotAfter.UTC().Format(time.RFC3339)), nil
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, u := range want.ExtKeyUsage { // Verify accepts any one of KeyUsages: check each
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return "", errors.Newf("embedetcd: %s does not verify: %v", certPath, err)
		}
	}
	var missing []string
	for _, ip := range want.IPAddresses {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			missing = append(missing, ip.String())
		}
	}
	for _, n := range want.DNSNames {
		if !slices.ContainsFunc(c.DNSNames, func(m string) bool { return strings.EqualFold(m, n) }) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("reissued %s: it did not name %s", certPath, strings.Join(missing, ", ")), nil
	}
	return "", nil
}

// keyPair is a certificate and its private key.
type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// loadPair reads a certificate and its key. Both missing is
// fs.ErrNotExist; anything else that stops their use is an error naming
// the file.
func loadPair(certPath, keyPath string) (*keyPair, error) {
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	switch {
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
		return nil, fs.ErrNotExist
	case errors.Is(cerr, fs.ErrNotExist):
		return nil, errors.Newf("embedetcd: %s is missing but its key %s is there: restore it, or remove both to have a new pair made", certPath, keyPath)
	case errors.Is(kerr, fs.ErrNotExist):
		return nil, errors.Newf("embedetcd: %s is missing but its certificate %s is there: restore it, or remove both to have a new pair made", keyPath, certPath)
	case cerr != nil:
		return nil, errors.Wrap(cerr, "embedetcd")
	case kerr != nil:
		return nil, errors.Wrap(kerr, "embedetcd")
	}
	if fi, err := os.Stat(keyPath); err != nil {
		return nil, errors.Wrap(err, "embedetcd")
	} else if fi.Mode().Perm()&0o077 != 0 {
		return nil, errors.Newf("embedetcd: %s has mode %v; want 0600 (it opens the embedded etcd)", keyPath, fi.Mode().Perm())
	}
	blk, rest := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.Newf("embedetcd: %s does not hold exactly one PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, errors.Newf("embedetcd: %s does not parse: %v", certPath, err)
	}
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, errors.Newf("embedetcd: %s does not parse or does not match %s: %v", keyPath, certPath, err)
	}
	key, ok := tc.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.Newf("embedetcd: %s: key type %T cannot sign", keyPath, tc.PrivateKey)
	}
	return &keyPair{cert: cert, key: key, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// newCA makes a self-signed CA valid for PKICAValidity from an hour before
// now (clock differences between the processes that check it).
func newCA(now time.Time) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Wrap(err, "embedetcd: CA key")
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "idrange embedded etcd CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	return sign(tmpl, nil, key, now, now.Add(PKICAValidity))
}

// issue signs a server or client certificate for a new key, valid for
// PKILeafValidity but not past the CA.
func (ca *keyPair) issue(tmpl *x509.Certificate, now time.Time) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, errors.Wrap(err, "embedetcd: key")
	}
	notAfter := now.Add(PKILeafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	return sign(tmpl, ca, key, now, notAfter)
}

// sign completes tmpl (serial, validity) and signs it with parent, or
// with key itself when parent is nil.
func sign(tmpl *x509.Certificate, parent *keyPair, key *ecdsa.PrivateKey, now, notAfter time.Time) (*keyPair, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, errors.Wrap(err, "embedetcd: serial")
	}
	t := *tmpl
	t.SerialNumber, t.NotBefore, t.NotAfter = serial, now.Add(-time.Hour), notAfter
	issuer, signer := &t, crypto.Signer(key)
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, &t, issuer, &key.PublicKey, signer)
	if err != nil {
		return nil, errors.Wrapf(err, "embedetcd: certificate %q", t.Subject.CommonName)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, errors.Wrapf(err, "embedetcd: certificate %q", t.Subject.CommonName)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, errors.Wrap(err, "embedetcd: key")
	}
	return &keyPair{cert: cert, key: key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})}, nil
}

// write replaces the key file, then the certificate file, each atomically
// (rename); keys get mode 0600, certificates 0644.
func (kp *keyPair) write(certPath, keyPath string) error {
	if err := writeAtomic(keyPath, kp.keyPEM, 0o600); err != nil {
		return err
	}
	return writeAtomic(certPath, kp.certPEM, 0o644)
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return errors.Wrap(err, "embedetcd")
	}
	defer os.Remove(tmp.Name()) // after a successful rename: no such file
	err = tmp.Chmod(mode)
	if err == nil {
		_, err = tmp.Write(b)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	return errors.Wrapf(err, "embedetcd: write %s", path)
}

// serverTemplate is the listeners' certificate: for TLS servers (client
// and peer ports) and TLS clients (etcd's gateway and peers dial with it),
// naming hosts.
func serverTemplate(hosts []string) *x509.Certificate {
	t := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "idrange embedded etcd"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			t.IPAddresses = append(t.IPAddresses, ip)
		} else {
			t.DNSNames = append(t.DNSNames, h)
		}
	}
	return t
}

// clientTemplate is the client certificate of the replica and operators.
func clientTemplate() *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: "idrange embedded etcd client"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// serverHosts are the names the server certificate carries for listeners
// on urls: each URL's host, and the loopback names 127.0.0.1, ::1 and
// localhost; for a wildcard host (0.0.0.0, ::) also this machine's
// hostname and interface addresses (link-local ones aside), which is what
// other hosts dial.
func serverHosts(urls ...url.URL) []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, u := range urls {
		h := u.Hostname()
		ip := net.ParseIP(h)
		if ip == nil || !ip.IsUnspecified() {
			add(h)
			continue
		}
		if name, err := os.Hostname(); err == nil {
			add(name)
		}
		addrs, _ := net.InterfaceAddrs() // none: the loopback names still work
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				add(n.IP.String())
			}
		}
	}
	return hosts
}
