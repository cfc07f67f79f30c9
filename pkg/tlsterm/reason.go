package tlsterm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
)

// Reason classifies a failed server handshake into one of a bounded set of
// labels (kvgate_tls_handshake_errors_total{reason}):
//
//	timeout      the client did not finish within the handshake timeout (a slow or silent ClientHello)
//	plain_http   the first bytes were a plain HTTP request
//	oversize     a record or handshake message above TLS's limits (an oversize ClientHello)
//	bad_record   the first bytes were not TLS at all (garbage)
//	client_cert  mtls_frontend refused the client's certificate, or its absence
//	eof          the client closed or reset the connection mid-handshake
//	protocol     anything else TLS refused: no common version, cipher or ALPN protocol, a bad message
func Reason(err error) string {
	var re tls.RecordHeaderError
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var ne net.Error
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.As(err, &re):
		h := re.RecordHeader
		switch {
		case looksLikeHTTP(h):
			return "plain_http"
		case h[0] == 0x16 && int(h[3])<<8|int(h[4]) >= 0x3000:
			// A handshake record Go refuses by its length alone before
			// reading it: an oversize ClientHello.
			return "oversize"
		}
		return "bad_record"
	case strings.Contains(msg, "oversized record") || strings.Contains(msg, "exceeds maximum"):
		return "oversize"
	case errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &ci) ||
		strings.Contains(msg, "didn't provide a certificate") || strings.Contains(msg, "client certificate"):
		return "client_cert"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EPIPE):
		return "eof"
	}
	return "protocol"
}

// looksLikeHTTP reports whether a record header's five bytes open an HTTP
// request line: a method in capitals, then a space or more capitals (the
// same test Go's net/http applies before answering 400).
func looksLikeHTTP(h [5]byte) bool {
	for _, m := range []string{"GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "PATCH", "DELET", "CONNE", "TRACE"} {
		if string(h[:]) == m {
			return true
		}
	}
	return false
}
