package aictrl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/pkg/apiauth"
)

// maxPEM bounds a CA or certificate file read here.
const maxPEM = 1 << 20

// ServerTLS is the controller's channel security, with the management API's
// file conventions (docs/security.md): a certificate and key that reload
// when their files change, and an optional client CA for mTLS.
type ServerTLS struct {
	Addr                            string
	CertFile, KeyFile, ClientCAFile string
	// Insecure allows plaintext beyond loopback.
	Insecure bool
	Log      *slog.Logger
}

// ServerCredentials builds the gRPC server credentials. Plaintext is allowed
// only on a loopback address or with Insecure. The returned *apiauth.TLS
// (nil for plaintext) follows the files once its Run is started.
func ServerCredentials(o ServerTLS) (credentials.TransportCredentials, *apiauth.TLS, error) {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, nil, errors.New("--tls-cert and --tls-key go together")
	}
	if o.ClientCAFile != "" && o.CertFile == "" {
		return nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if o.CertFile == "" {
		if !Loopback(o.Addr) && !o.Insecure {
			return nil, nil, fmt.Errorf("--grpc-addr %s is reachable beyond loopback: give --tls-cert and --tls-key, or --insecure to serve plaintext (docs/controller.md)", o.Addr)
		}
		if o.Insecure && o.Log != nil {
			o.Log.Warn("serving AiCtrl in plaintext (--insecure)", "addr", o.Addr)
		}
		return insecure.NewCredentials(), nil, nil
	}
	t, err := apiauth.NewTLS(apiauth.TLSOptions{CertFile: o.CertFile, KeyFile: o.KeyFile, ClientCAFile: o.ClientCAFile, Log: o.Log})
	if err != nil {
		return nil, nil, fmt.Errorf("controller TLS: %w", err)
	}
	return credentials.NewTLS(h2(t.Config())), t, nil
}

// h2 makes the management API's TLS configuration speak gRPC's ALPN,
// including the per-handshake configuration that carries a reloaded CA.
func h2(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = []string{"h2"}
	if inner := c.GetConfigForClient; inner != nil {
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := inner(h)
			if cc != nil {
				cc = cc.Clone()
				cc.NextProtos = []string{"h2"}
			}
			return cc, err
		}
	}
	return c
}

// ClientTLS is the gateway's side of the channel.
type ClientTLS struct {
	Addr string
	// CAFile verifies the controller's certificate; CertFile and KeyFile
	// are the gateway's client certificate for mTLS.
	CAFile, CertFile, KeyFile string
	ServerName                string
	Insecure                  bool
}

// ClientCredentials builds the gateway's credentials: TLS when a CA is
// given, plaintext only to a loopback controller or with Insecure.
func ClientCredentials(o ClientTLS) (credentials.TransportCredentials, error) {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("LOXILB_AI_CTRL_TLS_CERT and LOXILB_AI_CTRL_TLS_KEY go together")
	}
	if o.CAFile == "" {
		if o.CertFile != "" {
			return nil, errors.New("LOXILB_AI_CTRL_TLS_CERT needs LOXILB_AI_CTRL_TLS_CA")
		}
		if !Loopback(o.Addr) && !o.Insecure {
			return nil, fmt.Errorf("LOXILB_AI_CTRL_ADDR=%s is beyond loopback: set LOXILB_AI_CTRL_TLS_CA (and a client certificate for mTLS), or LOXILB_AI_CTRL_INSECURE=1 (docs/controller.md)", o.Addr)
		}
		return insecure.NewCredentials(), nil
	}
	ca, err := readPEM(o.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("LOXILB_AI_CTRL_TLS_CA %s: no certificate", o.CAFile)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: o.ServerName}
	if o.CertFile != "" {
		if _, err := apiauth.CheckSecretFile(o.KeyFile); err != nil {
			return nil, fmt.Errorf("LOXILB_AI_CTRL_TLS_KEY: %w", err)
		}
		// Read per handshake, so a rotated client certificate is used by
		// the next connection without a restart.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			return &c, err
		}
		if _, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile); err != nil {
			return nil, fmt.Errorf("LOXILB_AI_CTRL_TLS_CERT: %w", err)
		}
	}
	return credentials.NewTLS(cfg), nil
}

func readPEM(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxPEM {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxPEM)
	}
	return os.ReadFile(path)
}

// Loopback reports whether a host:port is bound to loopback only (an empty
// host listens everywhere; a name may resolve anywhere, except localhost).
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
