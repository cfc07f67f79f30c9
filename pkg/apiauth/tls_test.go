package apiauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCA mints certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns PEM certificate and key for a server (127.0.0.1) or client.
func (ca *testCA) issue(t *testing.T, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "kvgate-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// replace writes a file the way a rotation does: a new file renamed over the old.
func replace(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "https://" + ln.Addr().String()
}

func clientFor(roots ...*testCA) *http.Client {
	pool := x509.NewCertPool()
	for _, ca := range roots {
		pool.AddCert(ca.cert)
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
}

// A loop of requests runs while the certificate is replaced by one from
// another CA: no request fails, and new connections get the new certificate.
func TestCertificateRotationUnderLoad(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	oldCA, newCA := newTestCA(t, "old"), newTestCA(t, "new")
	c, k := oldCA.issue(t, 10, false)
	replace(t, certFile, c, 0o644)
	replace(t, keyFile, k, 0o600)
	tl, err := NewTLS(TLSOptions{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, tl.Config())
	client := clientFor(oldCA, newCA)

	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(url)
				if err != nil {
					failed.Add(1)
					t.Errorf("request during rotation: %v", err)
					return
				}
				resp.Body.Close()
				ok.Add(1)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	c2, k2 := newCA.issue(t, 20, false)
	replace(t, keyFile, k2, 0o600) // key first: a half-rotated pair must not be loaded
	tl.Reload()
	replace(t, certFile, c2, 0o644)
	tl.Reload()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() < 10 {
		t.Fatalf("%d ok, %d failed", ok.Load(), failed.Load())
	}
	resp, err := clientFor(newCA).Get(url)
	if err != nil {
		t.Fatalf("the new certificate is not served: %v", err)
	}
	resp.Body.Close()
	if resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 20 {
		t.Fatalf("serving serial %v", resp.TLS.PeerCertificates[0].SerialNumber)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, clientCA, other := newTestCA(t, "server"), newTestCA(t, "clients"), newTestCA(t, "other")
	c, k := ca.issue(t, 1, false)
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	replace(t, certFile, c, 0o644)
	replace(t, keyFile, k, 0o600)
	replace(t, caFile, clientCA.pem, 0o644)
	tl, err := NewTLS(TLSOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, tl.Config())
	withCert := func(issuer *testCA) *http.Client {
		cl := clientFor(ca)
		if issuer != nil {
			cp, kp := issuer.issue(t, 99, true)
			pair, _ := tls.X509KeyPair(cp, kp)
			cl.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{pair}
		}
		return cl
	}
	tests := []struct {
		name   string
		client *http.Client
		ok     bool
	}{
		{"no client certificate", withCert(nil), false},
		{"a certificate of another CA", withCert(other), false},
		{"a client certificate of the CA", withCert(clientCA), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := tc.client.Get(url)
			if resp != nil {
				resp.Body.Close()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	// The client CA reloads too.
	replace(t, caFile, other.pem, 0o644)
	tl.Reload()
	if resp, err := withCert(other).Get(url); err != nil {
		t.Fatalf("after the CA rotation: %v", err)
	} else {
		resp.Body.Close()
	}
}

func TestTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	c, k := ca.issue(t, 1, false)
	cert, key := filepath.Join(dir, "c"), filepath.Join(dir, "k")
	replace(t, cert, c, 0o644)
	replace(t, key, k, 0o644)
	goodKey := filepath.Join(dir, "k600")
	replace(t, goodKey, k, 0o600)
	tests := []struct {
		name string
		opts TLSOptions
		want string
	}{
		{"world-readable key", TLSOptions{CertFile: cert, KeyFile: key}, "has mode 0644"},
		{"no key", TLSOptions{CertFile: cert}, "both a certificate and a key"},
		{"missing certificate", TLSOptions{CertFile: filepath.Join(dir, "nope"), KeyFile: goodKey}, "nope"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewTLS(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
