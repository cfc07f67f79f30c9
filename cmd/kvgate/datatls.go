package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvgate/kvgate/pkg/apiauth"
	"github.com/kvgate/kvgate/pkg/tlsterm"
)

// dataTLSFlags configure TLS termination for rules with security 1 or 2
// (docs/security.md, "TLS termination on the data plane").
type dataTLSFlags struct {
	certDir          string
	reloadInterval   time.Duration
	handshakeTimeout time.Duration
}

func addDataTLSFlags(fl *pflag.FlagSet, f *dataTLSFlags) {
	fl.StringVar(&f.certDir, "tls-cert-dir", "", "certificates of TLS rules (security 1 or 2): DIR/<vip>_<port>/tls.crt and tls.key, extra SNI names in DIR/<vip>_<port>/<name>/; reloaded when they change")
	fl.DurationVar(&f.reloadInterval, "tls-reload-interval", apiauth.DefaultReloadInterval, "how often TLS rules' certificate files are checked for changes")
	fl.DurationVar(&f.handshakeTimeout, "tls-handshake-timeout", tlsterm.DefaultHandshakeTimeout, "how long a client may take to finish its TLS handshake")
}

func (f dataTLSFlags) check() error {
	if f.reloadInterval < 100*time.Millisecond || f.reloadInterval > time.Hour {
		return fmt.Errorf("--tls-reload-interval %s: want 100ms to 1h", f.reloadInterval)
	}
	if f.handshakeTimeout < 100*time.Millisecond || f.handshakeTimeout > 5*time.Minute {
		return fmt.Errorf("--tls-handshake-timeout %s: want 100ms to 5m", f.handshakeTimeout)
	}
	if f.certDir == "" {
		return nil
	}
	fi, err := os.Stat(f.certDir)
	if err != nil {
		return fmt.Errorf("--tls-cert-dir: %w", err)
	}
	if !fi.IsDir() {
		return errors.New("--tls-cert-dir " + f.certDir + ": not a directory")
	}
	return nil
}
