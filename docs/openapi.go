// Package docs carries the documents kvgate serves at run time: the OpenAPI
// document of the management API (openapi.yaml, served as JSON at
// /netlox/v1/openapi.json). The Markdown pages beside it are for people.
package docs

import _ "embed"

//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPIYAML returns a copy of docs/openapi.yaml.
func OpenAPIYAML() []byte { return append([]byte(nil), openAPIYAML...) }
