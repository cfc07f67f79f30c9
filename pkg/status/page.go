package status

import _ "embed"

// page is the self-contained status page: inline CSS and script, no external
// assets, so it works offline. It polls GET /netlox/v1/status.
//
//go:embed page.html
var page []byte

// Page returns a copy of the status page's HTML.
func Page() []byte { return append([]byte(nil), page...) }
