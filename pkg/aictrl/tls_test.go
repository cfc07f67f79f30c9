package aictrl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/testnet"
	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
)

type ackServer struct{ pb.UnimplementedAiCtrlServer }

func (ackServer) AckSnapshot(context.Context, *pb.Ack) (*pb.AckResponse, error) {
	return &pb.AckResponse{}, nil
}

// pki writes a CA, a server certificate for host and a client certificate
// into dir, keys 0600 as the management API requires.
func pki(t *testing.T, dir, host string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", "CERTIFICATE", caDER, 0o644)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		if ip := net.ParseIP(host); ip != nil {
			tpl.IPAddresses = []net.IP{ip}
		}
		der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		write(name+".pem", "CERTIFICATE", der, 0o644)
		write(name+"-key.pem", "EC PRIVATE KEY", kd, 0o600)
	}
	leaf("server", 2, x509.ExtKeyUsageServerAuth)
	leaf("client", 3, x509.ExtKeyUsageClientAuth)
}

func TestChannelTLS(t *testing.T) {
	host := testnet.Host(t)
	dir := t.TempDir()
	pki(t, dir, host)
	f := func(n string) string { return filepath.Join(dir, n) }
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	creds, state, err := ServerCredentials(ServerTLS{Addr: ln.Addr().String(), CertFile: f("server.pem"), KeyFile: f("server-key.pem"),
		ClientCAFile: f("ca.pem")})
	if err != nil || state == nil {
		t.Fatalf("server credentials: %v", err)
	}
	gs := grpc.NewServer(grpc.Creds(creds))
	pb.RegisterAiCtrlServer(gs, ackServer{})
	go gs.Serve(ln)
	defer gs.Stop()

	cases := []struct {
		name string
		c    ClientTLS
		ok   bool
	}{
		{"mTLS", ClientTLS{CAFile: f("ca.pem"), CertFile: f("client.pem"), KeyFile: f("client-key.pem")}, true},
		{"no client certificate", ClientTLS{CAFile: f("ca.pem")}, false},
		{"plaintext to a TLS server", ClientTLS{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.c.Addr = ln.Addr().String()
			cc, err := ClientCredentials(c.c)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := grpc.NewClient(c.c.Addr, grpc.WithTransportCredentials(cc))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = pb.NewAiCtrlClient(conn).AckSnapshot(ctx, &pb.Ack{GatewayId: "g"})
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok=%v", err, c.ok)
			}
		})
	}
}

func TestPlaintextOnlyOnLoopback(t *testing.T) {
	cases := []struct {
		addr     string
		insecure bool
		want     string
	}{
		{"127.0.0.1:18856", false, ""},
		{"[::1]:18856", false, ""},
		{"localhost:18856", false, ""},
		{":18856", false, "beyond loopback"},
		{"10.0.0.5:18856", false, "beyond loopback"},
		{"10.0.0.5:18856", true, ""},
	}
	for _, c := range cases {
		_, _, err := ServerCredentials(ServerTLS{Addr: c.addr, Insecure: c.insecure})
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Fatalf("server %s insecure=%v: %v", c.addr, c.insecure, err)
		}
		_, err = ClientCredentials(ClientTLS{Addr: c.addr, Insecure: c.insecure})
		if (c.want == "") != (err == nil) {
			t.Fatalf("client %s insecure=%v: %v", c.addr, c.insecure, err)
		}
	}
	if _, _, err := ServerCredentials(ServerTLS{Addr: "127.0.0.1:1", CertFile: "x"}); err == nil {
		t.Fatal("cert without key accepted")
	}
}
