// Package testcerts makes throw-away certificate authorities and
// certificates for tests: an ECDSA P-256 CA, server certificates for DNS
// names and IP addresses, and client certificates, written as PEM files
// with the modes kvgate requires (keys 0600).
package testcerts

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
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// Pair is a certificate and its key, in PEM.
type Pair struct {
	CertPEM, KeyPEM []byte
	Leaf            *x509.Certificate
}

// NewCA makes a CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// Server issues a server certificate for names (IP addresses become IP SANs).
func (ca *CA) Server(cn string, names ...string) (*Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageServerAuth, names)
}

// Client issues a client certificate.
func (ca *CA) Client(cn string) (*Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageClientAuth, nil)
}

func (ca *CA) issue(cn string, usage x509.ExtKeyUsage, names []string) (*Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Leaf:    leaf,
	}, nil
}

// TLS is the pair as a tls.Certificate.
func (p *Pair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(p.CertPEM, p.KeyPEM) }

// Write puts the pair at dir/tls.crt and dir/tls.key (0600), creating dir.
// Each file is written beside its target and renamed over it, as an
// operator's rotation would.
func (p *Pair) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "tls.crt"), p.CertPEM); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, "tls.key"), p.KeyPEM)
}

// WriteCA writes the CA certificate to path.
func (ca *CA) WriteCA(path string) error { return writeAtomic(path, ca.CertPEM) }

// Pool is a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func writeAtomic(path string, b []byte) error {
	tmp := fmt.Sprintf("%s.tmp%d", path, time.Now().UnixNano())
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// EngineCAs is the fixture of the engine-TLS tests: the CA a rule trusts
// (written to a file in a temporary directory of t, as backend_ca_path
// names one), and another CA whose certificates the rule must refuse.
func EngineCAs(t testing.TB) (trusted, other *CA, caFile string) {
	t.Helper()
	trusted, err := NewCA("engines")
	if err != nil {
		t.Fatal(err)
	}
	if other, err = NewCA("someone else"); err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := trusted.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	return trusted, other, caFile
}
