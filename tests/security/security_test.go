// Package security_test runs the real kvgate and kvctl binaries and curl
// against a management API with TLS and tokens: 401, 403 and 200 for each
// role, probes without a token, the unauthenticated metrics listener, clear
// kvctl errors, mutual TLS, start-up refusals (file modes, safe defaults), and
// a rule aimed at the API port refused.
package security_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testnet"
)

const (
	adminTok = "admin-0123456789abcdef0123456789"
	readTok  = "reader-0123456789abcdef0123456789"
)

type pki struct {
	dir                       string
	caFile, certFile, keyFile string
	clientCA                  string
	clientCert, clientKey     string
	ca, clientCAcert          *x509.Certificate
	caKey, clientCAKey        *ecdsa.PrivateKey
}

func mint(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	return c, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func newPKI(t *testing.T, host string) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	write := func(name string, b []byte, mode os.FileMode) string {
		path := filepath.Join(p.dir, name)
		if err := os.WriteFile(path, b, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	var caPEM []byte
	p.ca, p.caKey, caPEM, _ = mint(t, nil, nil, caTmpl)
	p.caFile = write("ca.crt", caPEM, 0o644)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host},
		IPAddresses: []net.IP{net.ParseIP(host)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	_, _, c, k := mint(t, p.ca, p.caKey, srvTmpl)
	p.certFile, p.keyFile = write("tls.crt", c, 0o644), write("tls.key", k, 0o600)
	ccaTmpl := *caTmpl
	ccaTmpl.Subject.CommonName = "client CA"
	var ccaPEM []byte
	p.clientCAcert, p.clientCAKey, ccaPEM, _ = mint(t, nil, nil, &ccaTmpl)
	p.clientCA = write("client-ca.crt", ccaPEM, 0o644)
	cliTmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "operator"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	_, _, cc, ck := mint(t, p.clientCAcert, p.clientCAKey, cliTmpl)
	p.clientCert, p.clientKey = write("client.crt", cc, 0o644), write("client.key", ck, 0o600)
	return p
}

var bins struct{ kvgate, kvctl string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvgate-security-bin")
	if err != nil {
		panic(err)
	}
	bins.kvgate, bins.kvctl = filepath.Join(dir, "kvgate"), filepath.Join(dir, "kvctl")
	for bin, pkg := range map[string]string{bins.kvgate: "./cmd/kvgate", bins.kvctl: "./cmd/kvctl"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type daemon struct {
	cmd  *exec.Cmd
	logs *bytes.Buffer
	api  string
}

func tokenFile(t *testing.T, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte("ops admin "+adminTok+"\ndashboard read "+readTok+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func secretFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func kvctl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bins.kvctl, args...)
	cmd.Env = append(os.Environ(), "KVCTL_TOKEN_FILE=", "KVCTL_CACERT=")
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

const ruleLine = "create lb 127.77.9.1 --tcp=18080:18000 --endpoints=127.77.9.2:1 --mode=fullproxy"

func TestTLSAndTokens(t *testing.T) {
	// The API host is random in 127/8; the certificate names it.
	d := startKvgateTLS(t)
	base := "https://" + d.d.api
	admin, reader := secretFile(t, adminTok), secretFile(t, "dashboard read "+readTok)

	t.Run("curl", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("curl not installed")
		}
		tests := []struct {
			name string
			args []string
			want string
		}{
			{"probe without a token", []string{base + "/healthz"}, "200"},
			{"rules without a token", []string{base + "/netlox/v1/config/loadbalancer/all"}, "401"},
			{"rules with the read token", []string{"-H", "Authorization: Bearer " + readTok, base + "/netlox/v1/config/loadbalancer/all"}, "200"},
			{"delete with the read token", []string{"-X", "DELETE", "-H", "Authorization: Bearer " + readTok, base + "/netlox/v1/config/loadbalancer/all"}, "403"},
		}
		for _, tc := range tests {
			out, err := exec.Command("curl", append([]string{"-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", d.pki.caFile}, tc.args...)...).CombinedOutput()
			if err != nil || string(out) != tc.want {
				t.Errorf("%s: curl answered %q (%v), want %s", tc.name, out, err, tc.want)
			}
		}
		out, _ := exec.Command("curl", "-s", "-D", "-", "-o", "/dev/null", "--cacert", d.pki.caFile, base+"/netlox/v1/status").CombinedOutput()
		if !strings.Contains(strings.ToLower(string(out)), `www-authenticate: bearer realm="kvgate"`) {
			t.Errorf("401 without WWW-Authenticate:\n%s", out)
		}
		if out, err := exec.Command("curl", "-s", base+"/healthz").CombinedOutput(); err == nil {
			t.Errorf("curl without --cacert trusted the test CA: %s", out)
		}
	})

	t.Run("kvctl", func(t *testing.T) {
		common := []string{"--api-server", base, "--cacert", d.pki.caFile}
		tests := []struct {
			name string
			args []string
			code int
			want string
		}{
			{"no token", append(strings.Fields("get lb"), common...), 1, "API error 401 Unauthorized: authentication required: send Authorization: Bearer <token> (give a valid token with --token-file or KVCTL_TOKEN_FILE)"},
			{"read token reads", append(strings.Fields("get lb"), append(common, "--token-file", reader)...), 0, "SERVICE_ID"},
			{"read token may not create", append(strings.Fields(ruleLine), append(common, "--token-file", reader)...), 1, "API error 403 Forbidden: token dashboard has role read; POST needs admin (this token's role may only read; use an admin token)"},
			{"admin creates", append(strings.Fields(ruleLine), append(common, "--token-file", admin)...), 0, ""},
			{"status with a token", append([]string{"status"}, append(common, "--token-file", reader)...), 0, "RULE 1"},
			{"no CA", append(strings.Fields("get lb"), "--api-server", base, "--token-file", admin), 1, "presents a certificate kvctl does not trust; pass the CA that signed it with --cacert"},
			{"plain http to a TLS port", append(strings.Fields("get lb"), "--api-server", "http://"+d.d.api), 1, ""},
		}
		for _, tc := range tests {
			out, code := kvctl(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("%s: exit %d, want %d, output:\n%s\nwant it to contain %q", tc.name, code, tc.code, out, tc.want)
			}
		}
		world := filepath.Join(t.TempDir(), "token")
		_ = os.WriteFile(world, []byte(adminTok), 0o644)
		if out, code := kvctl(t, append(strings.Fields("get lb"), append(common, "--token-file", world)...)...); code != 2 || !strings.Contains(out, "has mode 0644") {
			t.Errorf("a world-readable token file: exit %d\n%s", code, out)
		}
	})

	t.Run("a rule aimed at the API is refused", func(t *testing.T) {
		host, port, _ := net.SplitHostPort(d.d.api)
		line := fmt.Sprintf("create lb 127.77.9.3 --tcp=18081:%s --endpoints=%s:1 --mode=fullproxy", port, host)
		out, code := kvctl(t, append(strings.Fields(line), "--api-server", base, "--cacert", d.pki.caFile, "--token-file", admin)...)
		if code != 1 || !strings.Contains(out, "400") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})

	t.Run("metrics listener", func(t *testing.T) {
		for path, want := range map[string]int{"/metrics": 200, "/netlox/v1/config/loadbalancer/all": 404} {
			resp, err := http.Get("http://" + d.metrics + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%s: %d", path, resp.StatusCode)
			}
			if path == "/metrics" && !strings.Contains(string(b), `kvgate_api_auth_failures_total{reason="missing"}`) {
				t.Errorf("no auth-failure series on the metrics listener")
			}
		}
	})

	t.Run("audit", func(t *testing.T) {
		logs := d.d.logs.String()
		if !strings.Contains(logs, "msg=audit token=ops") || !strings.Contains(logs, "rule=127.77.9.1:18080/tcp") {
			t.Errorf("no audit line for the admin's create:\n%s", logs)
		}
		if strings.Contains(logs, adminTok) || strings.Contains(logs, readTok) {
			t.Error("a token reached the log")
		}
	})
}

type tlsDaemon struct {
	d       *daemon
	pki     *pki
	metrics string
}

func startKvgateTLS(t *testing.T, extra ...string) *tlsDaemon {
	t.Helper()
	host := testnet.Host(t)
	p := newPKI(t, host)
	mhost := testnet.Host(t)
	metrics := net.JoinHostPort(mhost, fmt.Sprint(testnet.Port(t, mhost)))
	api := net.JoinHostPort(host, fmt.Sprint(testnet.Port(t, host)))
	args := append([]string{"--api", api, "--api-tls-cert", p.certFile, "--api-tls-key", p.keyFile,
		"--api-token-file", tokenFile(t, 0o600), "--metrics-addr", metrics}, extra...)
	d := startKvgateAt(t, api, args...)
	return &tlsDaemon{d: d, pki: p, metrics: metrics}
}

func startKvgateAt(t *testing.T, api string, args ...string) *daemon {
	t.Helper()
	d := &daemon{api: api, logs: &bytes.Buffer{}}
	all := append([]string{"--state-dir", t.TempDir(), "--tokenizer-dir", t.TempDir(), "--datapath", "userspace"}, args...)
	d.cmd = exec.Command(bins.kvgate, all...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.cmd.Wait()
		if t.Failed() {
			t.Logf("kvgate log:\n%s", d.logs)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", d.api, time.Second); err == nil {
			c.Close()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvgate did not listen on %s:\n%s", d.api, d.logs)
		}
	}
}

func TestMutualTLSWithKvctl(t *testing.T) {
	host := testnet.Host(t)
	p := newPKI(t, host)
	api := net.JoinHostPort(host, fmt.Sprint(testnet.Port(t, host)))
	startKvgateAt(t, api, "--api", api, "--api-tls-cert", p.certFile, "--api-tls-key", p.keyFile, "--api-client-ca", p.clientCA,
		"--api-token-file", tokenFile(t, 0o600))
	admin := secretFile(t, adminTok)
	common := []string{"get", "lb", "--api-server", "https://" + api, "--cacert", p.caFile, "--token-file", admin}
	if out, code := kvctl(t, common...); code != 1 || !strings.Contains(out, "requires a client certificate; pass one with --cert and --key") {
		t.Errorf("without a client certificate: exit %d\n%s", code, out)
	}
	if out, code := kvctl(t, append(common, "--cert", p.clientCert, "--key", p.clientKey)...); code != 0 {
		t.Errorf("with a client certificate: exit %d\n%s", code, out)
	}
	// A raw client without a certificate fails the handshake itself.
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	if c, err := tls.Dial("tcp", api, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("the API talked to a client without a certificate")
		}
		c.Close()
	}
}

// Start-up refusals: each exits non-zero at once with a message naming the
// problem, before any listener opens.
func TestStartRefusals(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	loose := tokenFile(t, 0o644)
	looseKey := filepath.Join(t.TempDir(), "k")
	b, _ := os.ReadFile(p.keyFile)
	_ = os.WriteFile(looseKey, b, 0o640)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"token file readable by others", []string{"--api", "127.0.0.1:0", "--api-token-file", loose}, loose + " has mode 0644"},
		{"key readable by the group", []string{"--api", "127.0.0.1:0", "--api-tls-cert", p.certFile, "--api-tls-key", looseKey}, looseKey + " has mode 0640"},
		{"beyond loopback without TLS or tokens", []string{"--api", "0.0.0.0:0"}, "--api 0.0.0.0:0 is reachable beyond loopback: give --api-tls-cert, --api-tls-key and --api-token-file, or --api-insecure"},
		{"beyond loopback with tokens only", []string{"--api", "[::]:0", "--api-token-file", tokenFile(t, 0o600)}, "is reachable beyond loopback"},
		{"a certificate without its key", []string{"--api-tls-cert", p.certFile}, "--api-tls-cert and --api-tls-key go together"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bins.kvgate, append([]string{"--state-dir", t.TempDir(), "--tokenizer-dir", t.TempDir(), "--datapath", "userspace"}, tc.args...)...)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("kvgate did not refuse to start")
			}
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Fatalf("err %v, output:\n%s\nwant %q", err, out, tc.want)
			}
		})
	}
}
