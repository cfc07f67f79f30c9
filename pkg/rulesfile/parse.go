// Package rulesfile reads kvgate's declarative rule source (--rules-file): a
// YAML or JSON file, typically a Kubernetes ConfigMap mounted into every
// replica, that lists load-balancer rules in the management API's own shape
// with each endpoint's ep_idx fixed, so every replica numbers endpoints alike.
// A Watcher reconciles the rule table with it at start and whenever it
// changes. docs/replicas.md has the format and which side wins over REST.
package rulesfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvgate/kvgate/pkg/api"
	"github.com/kvgate/kvgate/pkg/config"
)

// MaxFileBytes bounds a rules file (a ConfigMap holds at most 1 MiB; the
// management API takes rule bodies up to 4 MiB).
const MaxFileBytes = 4 << 20

// maxServiceID bounds a service_id a file may fix.
const maxServiceID = 1 << 20

// Known keys. A file is checked strictly, unlike a REST body: nobody reads a
// mounted file's debug log, and a misspelt field would be silently off on
// every replica. lbAttr and the endpoint's state and counter are accepted so
// that GET …/loadbalancer/all output can be used as a file as it is.
var (
	knownTopKeys      = []string{"rules", "lbAttr"}
	knownRuleKeys     = []string{"serviceArguments", "endpoints", "owner"}
	knownArgKeys      = append(jsonKeys(reflect.TypeFor[config.ServiceArguments]()), "service_id")
	knownEndpointKeys = []string{"endpointIP", "targetPort", "weight", "ep_role", "nixl_port", "admin", "ep_idx", "state", "counter"}
)

func jsonKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// Error is a rules file kvgate cannot take; Msg names the file, the rule and
// the field.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func fail(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// Parse reads a rules file's bytes. ${NAME} is replaced by the environment
// variable NAME (getenv; an unset variable is an error), so replicas on one
// host can give each its own VIP from one file. Every rule is validated as
// a POST would be (settings supply the process seed), and every endpoint
// must carry its ep_idx. The first problem is returned as an *Error naming
// the rule and the field.
func Parse(data []byte, settings config.Settings, getenv func(string) (string, bool)) ([]api.FileRule, error) {
	if len(data) > MaxFileBytes {
		return nil, fail("the file is %d bytes; at most %d", len(data), MaxFileBytes)
	}
	text, err := expand(string(data), getenv)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return nil, fail("not YAML or JSON: %v", err)
	}
	list, err := ruleList(doc)
	if err != nil {
		return nil, err
	}
	if len(list) > api.MaxRules {
		return nil, fail("%d rules; at most %d", len(list), api.MaxRules)
	}
	out := make([]api.FileRule, 0, len(list))
	keys := map[config.RuleKey]string{}
	ids := map[int]string{}
	for i, raw := range list {
		fr, err := parseRule(i, raw, settings)
		if err != nil {
			return nil, err
		}
		k := fr.Rule.Key()
		if prev, dup := keys[k]; dup {
			return nil, fail("%s: serviceArguments: the rule %s is listed twice (also %s)", fr.Where, k, prev)
		}
		keys[k] = fr.Where
		if fr.ServiceIDGiven {
			if prev, dup := ids[fr.Rule.ServiceID]; dup {
				return nil, fail("%s: serviceArguments.service_id: %d is also %s's", fr.Where, fr.Rule.ServiceID, prev)
			}
			ids[fr.Rule.ServiceID] = fr.Where
		}
		out = append(out, fr)
	}
	return out, nil
}

var varRef = regexp.MustCompile(`\$\{([^}]*)\}`)
var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expand replaces ${NAME} references; a bare $ is left alone (probe paths
// and seeds may hold one). The first bad or unset reference is the error.
func expand(text string, getenv func(string) (string, bool)) (string, error) {
	var b strings.Builder
	last := 0
	for _, m := range varRef.FindAllStringSubmatchIndex(text, -1) {
		ref, name := text[m[0]:m[1]], text[m[2]:m[3]]
		line := 1 + strings.Count(text[:m[0]], "\n")
		if !varName.MatchString(name) {
			return "", fail("line %d: %s is not a variable reference (want ${NAME}, NAME of letters, digits and _)", line, ref)
		}
		v, ok := getenv(name)
		if !ok {
			return "", fail("line %d: ${%s}: the environment variable %s is not set", line, name, name)
		}
		b.WriteString(text[last:m[0]])
		b.WriteString(v)
		last = m[1]
	}
	b.WriteString(text[last:])
	return b.String(), nil
}

// ruleList finds the rule list: {"rules":[…]} or GET's {"lbAttr":[…]}.
func ruleList(doc any) ([]any, error) {
	if doc == nil {
		return nil, nil // an empty file: no rules
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, fail("the top level must be a mapping with a rules list (rules: [...])")
	}
	if err := unknownKeys("", top, knownTopKeys); err != nil {
		return nil, err
	}
	if _, both := top["lbAttr"]; both && top["rules"] != nil {
		return nil, fail("rules and lbAttr: give one list, not both")
	}
	raw := top["rules"]
	if raw == nil {
		raw = top["lbAttr"]
	}
	if raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fail("rules: must be a list of rules")
	}
	return list, nil
}

func unknownKeys(prefix string, m map[string]any, known []string) error {
	var unknown []string
	for k := range m {
		if !slices.Contains(known, k) {
			unknown = append(unknown, prefix+k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	if strings.HasSuffix(unknown[0], "allowedSources") {
		return fail("%s: source allow-lists are not supported yet, and kvgate will not ignore one (docs/api.md)", unknown[0])
	}
	return fail("%s: unknown field (known: %s)", unknown[0], strings.Join(known, ", "))
}

// parseRule decodes, checks and normalises rules[i].
func parseRule(i int, raw any, settings config.Settings) (api.FileRule, error) {
	where := fmt.Sprintf("rules[%d]", i)
	m, ok := raw.(map[string]any)
	if !ok {
		return api.FileRule{}, fail("%s: must be a mapping with serviceArguments and endpoints", where)
	}
	args, _ := m["serviceArguments"].(map[string]any)
	if args == nil {
		return api.FileRule{}, fail("%s: serviceArguments: required (a mapping)", where)
	}
	if a, ok := args["externalIP"].(string); ok {
		where = fmt.Sprintf("%s (%s)", where, net.JoinHostPort(a, fmt.Sprint(args["port"])))
	}
	if err := checkShape(where, m, args); err != nil {
		return api.FileRule{}, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return api.FileRule{}, fail("%s: %v", where, err)
	}
	var r config.Rule
	if err := json.Unmarshal(b, &r); err != nil {
		return api.FileRule{}, fail("%s: %s", where, decodeMessage(err))
	}
	r.NextIdx, r.Owner = 0, ""
	if err := config.Validate(&r, settings); err != nil {
		return api.FileRule{}, fail("%s: %v", where, err)
	}
	r.Args.ExternalIP = r.Key().ExternalIP
	r.Args.Protocol = r.Key().Protocol
	for j := range r.Endpoints {
		if ip := net.ParseIP(r.Endpoints[j].IP); ip != nil {
			r.Endpoints[j].IP = ip.String()
		}
	}
	_, given := args["service_id"]
	return api.FileRule{Rule: &r, Where: where, ServiceIDGiven: given}, nil
}

// checkShape checks the keys, service_id and every endpoint's ep_idx on the
// generic document, where presence is still visible.
func checkShape(where string, m, args map[string]any) error {
	if err := unknownKeys(where+".", m, knownRuleKeys); err != nil {
		return err
	}
	if err := unknownKeys(where+".serviceArguments.", args, knownArgKeys); err != nil {
		return err
	}
	if v, ok := args["service_id"]; ok {
		id, isInt := v.(int)
		if !isInt || id < 1 || id > maxServiceID {
			return fail("%s: serviceArguments.service_id: %v is invalid; want an integer 1-%d (or leave it out)", where, v, maxServiceID)
		}
	}
	eps, ok := m["endpoints"].([]any)
	if !ok && m["endpoints"] != nil {
		return fail("%s: endpoints: must be a list", where)
	}
	seen := map[int]int{}
	for j, raw := range eps {
		ep, ok := raw.(map[string]any)
		if !ok {
			return fail("%s: endpoints[%d]: must be a mapping", where, j)
		}
		if err := unknownKeys(fmt.Sprintf("%s.endpoints[%d].", where, j), ep, knownEndpointKeys); err != nil {
			return err
		}
		v, present := ep["ep_idx"]
		idx, isInt := v.(int)
		switch {
		case !present:
			return fail("%s: endpoints[%d].ep_idx: required in a rules file, so every replica numbers endpoints alike", where, j)
		case !isInt || idx < 0 || idx >= config.MaxEndpoints:
			return fail("%s: endpoints[%d].ep_idx: %v is invalid; want an integer 0-%d", where, j, v, config.MaxEndpoints-1)
		}
		if prev, dup := seen[idx]; dup {
			return fail("%s: endpoints[%d].ep_idx: %d is also endpoints[%d]'s", where, j, idx, prev)
		}
		seen[idx] = j
	}
	return nil
}

// decodeMessage names the field of a JSON type error.
func decodeMessage(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		field := ute.Field
		if strings.HasPrefix(err.Error(), "serviceArguments:") && !strings.HasPrefix(field, "serviceArguments") {
			field = "serviceArguments." + field
		}
		return fmt.Sprintf("%s: got %s, want %s", field, ute.Value, ute.Type)
	}
	return err.Error()
}
