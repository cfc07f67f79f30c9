package fullproxy

import "regexp"

// addrPattern matches what Go's net errors and kvgate's own messages print
// for a backend: IPv4 with an optional port, bracketed IPv6 (with a zone and
// a port), and bare IPv6 with at least two colons.
var addrPattern = regexp.MustCompile(`\[[0-9A-Fa-f:.]+(%[\w.-]+)?\](:\d{1,5})?|\b\d{1,3}(\.\d{1,3}){3}(:\d{1,5})?\b|\b[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}\b`)

// redactAddrs replaces backend addresses in an error detail meant for the
// client: clients learn which endpoint index failed (the decision header and
// access log carry it), not the fleet's addresses, which stay in kvgate's
// logs (docs/dataplane.md).
func redactAddrs(detail string) string {
	return addrPattern.ReplaceAllString(detail, "<endpoint>")
}
