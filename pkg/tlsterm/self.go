package tlsterm

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"time"
)

// SelfClientConfig is a client configuration that accepts exactly the
// certificate this rule serves to clients without SNI now (the rule's own
// pair, as reloaded), and only while it is within its validity period.
// kvgate's preflight sends its probe requests through the rule's VIP with
// it: a VIP answered by anything else than this rule's listener (another
// process on the address, a stale certificate) fails the probe, whatever
// CA signed the certificate and whatever names it carries (docs/preflight.md).
func (t *Terminator) SelfClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		// The chain and name checks are replaced by the pin below, which is
		// stricter: only the one certificate kvgate loaded passes.
		InsecureSkipVerify: true,
		VerifyConnection:   t.verifySelf,
	}
}

func (t *Terminator) verifySelf(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the VIP presented no certificate")
	}
	got := cs.PeerCertificates[0]
	want := t.def.Certificate()
	if want == nil || len(want.Certificate) == 0 || !bytes.Equal(got.Raw, want.Certificate[0]) {
		return fmt.Errorf("the VIP presented a certificate (subject %q, issuer %q) that is not the one kvgate loaded for the rule from %s",
			got.Subject.String(), got.Issuer.String(), t.opts.Dir)
	}
	now := time.Now()
	if now.Before(got.NotBefore) || now.After(got.NotAfter) {
		return fmt.Errorf("the rule's certificate in %s is valid from %s to %s, not now: clients will refuse it",
			t.opts.Dir, got.NotBefore.UTC().Format(time.RFC3339), got.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}
