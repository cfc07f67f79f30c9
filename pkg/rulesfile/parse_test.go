package rulesfile

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestParseTwoRules(t *testing.T) {
	data, err := os.ReadFile("testdata/two-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := Parse(data, config.DefaultSettings(), env(map[string]string{"KVGATE_TEST_VIP": "10.0.0.1"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 {
		t.Fatalf("%d rules", len(rules))
	}
	r := rules[0]
	if !r.ServiceIDGiven || r.Rule.ServiceID != 7 || r.Rule.Args.ExternalIP != "10.0.0.1" || r.Rule.Args.Name != "chat" {
		t.Fatalf("rule 0: %+v", r)
	}
	if r.Rule.Endpoints[0].Idx != 3 || r.Rule.Endpoints[1].Idx != 0 {
		t.Fatalf("ep_idx not kept: %+v", r.Rule.Endpoints)
	}
	if rules[1].ServiceIDGiven || !rules[1].Rule.Endpoints[0].AdminDown || rules[1].Rule.Endpoints[0].Idx != 5 || rules[1].Rule.Args.Protocol != "tcp" {
		t.Fatalf("rule 1: %+v", rules[1])
	}
}

const okRule = `{"serviceArguments":{"externalIP":"10.0.0.1","port":8000,"mode":4},"endpoints":[{"endpointIP":"10.0.0.11","targetPort":8000,"ep_idx":0}]}`

// TestParseJSONAndGETShape: JSON works, and so does the management API's GET
// output ({"lbAttr":[…]} with state and counter fields).
func TestParseJSONAndGETShape(t *testing.T) {
	for _, doc := range []string{
		`{"rules":[` + okRule + `]}`,
		`{"lbAttr":[{"serviceArguments":{"externalIP":"10.0.0.1","port":8000,"mode":4,"service_id":2},"endpoints":[{"endpointIP":"10.0.0.11","targetPort":8000,"weight":0,"ep_role":0,"ep_idx":4,"state":"active","admin":"up"}]}]}`,
	} {
		rules, err := Parse([]byte(doc), config.DefaultSettings(), env(nil))
		if err != nil || len(rules) != 1 {
			t.Fatalf("%s: %v", doc, err)
		}
	}
	if rules, err := Parse(nil, config.DefaultSettings(), env(nil)); err != nil || len(rules) != 0 {
		t.Fatalf("empty file: %v %v", rules, err)
	}
}

// TestParseErrorsNameTheField: every bad file is refused with a message that
// names the rule and the field.
func TestParseErrorsNameTheField(t *testing.T) {
	ep := func(extra string) string {
		return `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":8000,"mode":4},"endpoints":[{"endpointIP":"10.0.0.11","targetPort":8000` + extra + `}]}]}`
	}
	cases := []struct{ name, doc, want string }{
		{"no ep_idx", ep(""), "rules[0] (10.0.0.1:8000): endpoints[0].ep_idx: required"},
		{"ep_idx out of range", ep(`,"ep_idx":256`), "endpoints[0].ep_idx: 256 is invalid"},
		{"ep_idx not an integer", ep(`,"ep_idx":"a"`), "endpoints[0].ep_idx: a is invalid"},
		{"unknown endpoint field", ep(`,"ep_idx":0,"wieght":1`), "rules[0] (10.0.0.1:8000).endpoints[0].wieght: unknown field"},
		{"bad port", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":70000,"mode":4},"endpoints":[]}]}`, "rules[0] (10.0.0.1:70000): serviceArguments.port"},
		{"unknown arg", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":80,"kvExactmode":3},"endpoints":[]}]}`, "serviceArguments.kvExactmode: unknown field"},
		{"allowedSources", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":80,"allowedSources":["1.2.3.4/32"]},"endpoints":[]}]}`, "allowedSources: source allow-lists are not supported"},
		{"wrong type", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":"eighty"},"endpoints":[]}]}`, "serviceArguments.port: got string"},
		{"bad service_id", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":80,"service_id":0},"endpoints":[]}]}`, "serviceArguments.service_id: 0 is invalid"},
		{"duplicate ep_idx", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":80,"mode":4},"endpoints":[{"endpointIP":"10.0.0.11","targetPort":1,"ep_idx":1},{"endpointIP":"10.0.0.12","targetPort":1,"ep_idx":1}]}]}`, "endpoints[1].ep_idx: 1 is also endpoints[0]'s"},
		{"duplicate rule", `{"rules":[` + okRule + `,` + okRule + `]}`, "rules[1] (10.0.0.1:8000): serviceArguments: the rule 10.0.0.1:8000/tcp is listed twice"},
		{"duplicate service_id", `{"rules":[{"serviceArguments":{"externalIP":"10.0.0.1","port":80,"service_id":3},"endpoints":[]},{"serviceArguments":{"externalIP":"10.0.0.1","port":81,"service_id":3},"endpoints":[]}]}`, "rules[1] (10.0.0.1:81): serviceArguments.service_id: 3 is also rules[0]"},
		{"unset variable", "rules:\n  - serviceArguments: {externalIP: ${NOPE}, port: 80}\n", "line 2: ${NOPE}: the environment variable NOPE is not set"},
		{"bad variable", "rules: [] # ${1x}\n", "line 1: ${1x} is not a variable reference"},
		{"top level list", `[` + okRule + `]`, "the top level must be a mapping"},
		{"unknown top key", `{"rule":[]}`, "rule: unknown field"},
		{"rules not a list", `{"rules":{}}`, "rules: must be a list"},
		{"syntax", "rules: [\n", "not YAML or JSON"},
		{"rule not a mapping", `{"rules":[1]}`, "rules[0]: must be a mapping"},
		{"no serviceArguments", `{"rules":[{"endpoints":[]}]}`, "rules[0]: serviceArguments: required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc), config.DefaultSettings(), env(nil))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want it to contain %q", err, c.want)
			}
		})
	}
	big := make([]byte, MaxFileBytes+1)
	if _, err := Parse(big, config.DefaultSettings(), env(nil)); err == nil {
		t.Fatal("an oversized file was accepted")
	}
}

// FuzzParse: no input panics or hangs the parser.
func FuzzParse(f *testing.F) {
	data, _ := os.ReadFile("testdata/two-rules.yaml")
	f.Add(data)
	f.Add([]byte(`{"rules":[` + okRule + `]}`))
	f.Add([]byte("rules: [${X}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Parse(b, config.DefaultSettings(), env(map[string]string{"X": "1", "KVGATE_TEST_VIP": "10.0.0.1"}))
	})
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
