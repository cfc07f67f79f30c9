// Package openapi_test keeps docs/openapi.yaml true: the routes it documents
// are exactly the routes pkg/api serves, its rule schemas have exactly the
// fields kvgate (and kvctl, which posts config.ServiceArguments) reads and
// writes, and a real OpenAPI validator accepts it and every live answer to
// its example requests (node check.mjs, @apidevtools/swagger-parser + ajv).
package openapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
)

const docPath = "../../docs/openapi.yaml"

type document struct {
	Paths      map[string]map[string]any `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

func loadDoc(t *testing.T) document {
	t.Helper()
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	var d document
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	return d
}

var param = regexp.MustCompile(`\{[^}]+\}`)

func TestRoutesMatchDocument(t *testing.T) {
	d := loadDoc(t)
	documented := map[string]bool{}
	for path, item := range d.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				documented[strings.ToUpper(method)+" "+param.ReplaceAllString(path, "{}")] = true
			}
		}
	}
	served := map[string]bool{}
	for _, r := range api.Routes() {
		// "/{$}" is ServeMux's spelling of exactly "/".
		pattern := strings.TrimSuffix(r.Pattern, "{$}")
		served[r.Method+" "+param.ReplaceAllString(pattern, "{}")] = true
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("pkg/api serves %s, which docs/openapi.yaml does not document", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("docs/openapi.yaml documents %s, which pkg/api does not serve", r)
		}
	}
}

func jsonKeys(v any) []string {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func tagKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	sort.Strings(keys)
	return keys
}

func props(t *testing.T, d document, schema string) []string {
	t.Helper()
	s, ok := d.Components.Schemas[schema]
	if !ok {
		t.Fatalf("docs/openapi.yaml has no schema %s", schema)
	}
	keys := make([]string, 0, len(s.Properties))
	for k := range s.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// The rule fields kvgate reads (config.ServiceArguments, which kvctl embeds in
// what it posts) and writes (service_id, ep_idx, state) are the document's.
func TestRuleFieldsMatchDocument(t *testing.T) {
	d := loadDoc(t)
	tests := []struct {
		schema string
		fields []string
	}{
		{"ServiceArguments", append(tagKeys(reflect.TypeFor[config.ServiceArguments]()), "service_id")},
		{"Endpoint", append(jsonKeys(config.Endpoint{NixlPort: 1}), "state")},
	}
	for _, tc := range tests {
		sort.Strings(tc.fields)
		if got := props(t, d, tc.schema); !slices.Equal(got, tc.fields) {
			t.Errorf("%s: documented %v\nkvgate has %v", tc.schema, got, tc.fields)
		}
	}
}

// TestLiveAPIAgainstDocument runs node check.mjs against a live gateway: it
// validates the document and every documented example request's answer.
func TestLiveAPIAgainstDocument(t *testing.T) {
	node, err := exec.LookPath("node")
	_, modErr := os.Stat("node/node_modules/@apidevtools/swagger-parser/package.json")
	if err != nil || modErr != nil {
		if os.Getenv("KVGATE_REQUIRE_NODE") != "" {
			t.Fatalf("KVGATE_REQUIRE_NODE is set but node (%v) or tests/openapi/node/node_modules (%v) is missing; run npm ci in tests/openapi/node", err, modErr)
		}
		t.Skip("node or tests/openapi/node/node_modules missing (npm ci in tests/openapi/node)")
	}
	settings := config.DefaultSettings()
	g, err := gateway.New(gateway.Options{Settings: settings, TokenizerDir: t.TempDir(), ShutdownGrace: 2 * time.Second,
		Datapath: "userspace", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.Shutdown()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, ln) }()
	defer func() { cancel(); <-done }()

	cmd := exec.Command(node, "check.mjs", "../"+docPath, "http://"+ln.Addr().String())
	cmd.Dir = "node"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node check.mjs: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
