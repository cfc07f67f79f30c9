package metrics

// TLS termination and per-rule body legs (docs/security.md).

// TLSHandshakeReasons are the reason labels of
// kvgate_tls_handshake_errors_total, pre-created per TLS rule.
var TLSHandshakeReasons = []string{"timeout", "plain_http", "oversize", "bad_record", "client_cert", "eof", "protocol"}

// SetRuleDatapath publishes the body path a rule's responses take and why.
func (m *Metrics) SetRuleDatapath(service int, path, reason string) {
	s := itoa(service)
	m.RuleDatapath.DeletePartialMatch(map[string]string{"service": s})
	m.RuleDatapath.WithLabelValues(s, path, reason).Set(1)
}

// InitTLSRule pre-creates a TLS rule's handshake-error series at 0.
func (m *Metrics) InitTLSRule(service int) {
	s := itoa(service)
	for _, r := range TLSHandshakeReasons {
		m.TLSHandshakeErrors.WithLabelValues(s, r)
	}
}

// TLSHandshakeFailed counts one failed client handshake.
func (m *Metrics) TLSHandshakeFailed(service int, reason string) {
	m.TLSHandshakeErrors.WithLabelValues(itoa(service), reason).Inc()
}

// TLSCertReload counts one reload of a rule's certificate files.
func (m *Metrics) TLSCertReload(service int, ok bool) {
	result := "error"
	if ok {
		result = "ok"
	}
	m.TLSCertReloads.WithLabelValues(itoa(service), result).Inc()
}

// BackendConnResults are the result labels of
// kvgate_backend_connections_total, pre-created per pooled rule.
var BackendConnResults = []string{"reused", "dialed", "stale"}

// InitBackendPool pre-creates a pooled rule's connection series at 0.
func (m *Metrics) InitBackendPool(service int) {
	s := itoa(service)
	for _, r := range BackendConnResults {
		m.BackendConns.WithLabelValues(s, r)
	}
}

// BackendConn counts one engine connection a request took, by result.
func (m *Metrics) BackendConn(service int, result string) {
	m.BackendConns.WithLabelValues(itoa(service), result).Inc()
}
