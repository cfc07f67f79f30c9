package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kvgate/kvgate/pkg/config"
)

// Known JSON keys, for the debug log of ignored ones. Migrated LoxiLB
// scripts carry fields kvgate has no use for (secondaryIPs, bgp,
// inactiveTimeOut, …); they are ignored, not rejected. allowedSources is the
// exception (unsupportedField): ignoring a source allow-list would open the
// VIP to every client the operator meant to keep out.
var (
	knownTopKeys      = []string{"serviceArguments", "endpoints"}
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

type successBody struct {
	Result    string `json:"result"`
	ServiceID int    `json:"service_id,omitempty"`
}

type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := statusOf(err)
	if status >= 500 {
		s.log.Error("management API request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", msg)
	} else {
		s.log.Info("management API request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", msg)
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// readBody reads a bounded request body.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBody)}
		}
		return nil, badRequest("reading request body: %v", err)
	}
	return b, nil
}

// decodeBody reads a bounded JSON request body into v and returns its bytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) ([]byte, error) {
	body, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return nil, decodeError(err)
	}
	return body, nil
}

// keyedBody reads the rule key from the path and the JSON body into v.
func keyedBody(w http.ResponseWriter, r *http.Request, v any) (config.RuleKey, error) {
	k, err := keyFromPath(r)
	if err != nil {
		return k, err
	}
	_, err = decodeBody(w, r, v)
	return k, err
}

func ruleNotFound(k config.RuleKey) error {
	return &apiError{http.StatusNotFound, fmt.Sprintf("rule %s not found", k)}
}

// decodeError turns a JSON decoding error into a 400 that names the field.
func decodeError(err error) error {
	var ve *config.ValidationError
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &ve):
		return ve
	case errors.As(err, &ute):
		field := ute.Field
		if strings.HasPrefix(err.Error(), "serviceArguments:") && !strings.HasPrefix(field, "serviceArguments") {
			field = "serviceArguments." + field
		}
		return badRequest("%s: got a JSON %s, want %s", field, ute.Value, jsonTypeName(ute.Type))
	case errors.As(err, &se):
		return badRequest("malformed JSON at byte %d: %v", se.Offset, se)
	}
	return badRequest("malformed JSON: %v", err)
}

func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.Slice:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return t.String()
}

// postedShape is the loose view of a posted rule: which keys were present.
type postedShape struct {
	Top       map[string]json.RawMessage
	Args      map[string]json.RawMessage
	Endpoints []map[string]json.RawMessage
}

func (s *Server) inspectKeys(body []byte) postedShape {
	var p postedShape
	if json.Unmarshal(body, &p.Top) != nil {
		return p
	}
	_ = json.Unmarshal(p.Top["serviceArguments"], &p.Args)
	_ = json.Unmarshal(p.Top["endpoints"], &p.Endpoints)
	var unknown []string
	for k := range p.Top {
		if !slices.Contains(knownTopKeys, k) {
			unknown = append(unknown, k)
		}
	}
	for k := range p.Args {
		if !slices.Contains(knownArgKeys, k) {
			unknown = append(unknown, "serviceArguments."+k)
		}
	}
	for i, ep := range p.Endpoints {
		for k := range ep {
			if !slices.Contains(knownEndpointKeys, k) {
				unknown = append(unknown, fmt.Sprintf("endpoints[%d].%s", i, k))
			}
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		s.log.Debug("ignoring unknown rule fields", "fields", unknown)
	}
	return p
}

// unsupportedField refuses a posted field whose meaning kvgate cannot honour
// and must not ignore: a non-empty allowedSources (LoxiLB's per-rule source
// allow-list), at the top level or in serviceArguments. Empty lists and null
// are accepted, as they restrict nothing.
func unsupportedField(p postedShape) error {
	for _, c := range []struct {
		field string
		raw   json.RawMessage
	}{{"allowedSources", p.Top["allowedSources"]}, {"serviceArguments.allowedSources", p.Args["allowedSources"]}} {
		var list []json.RawMessage
		if len(c.raw) == 0 || string(c.raw) == "null" {
			continue
		}
		if err := json.Unmarshal(c.raw, &list); err == nil && len(list) == 0 {
			continue
		}
		return &config.ValidationError{Field: c.field, Msg: c.field + ": source allow-lists are not supported yet, and kvgate will not ignore one (every client could reach the VIP); remove the field or filter sources in front of kvgate (docs/api.md)"}
	}
	return nil
}

func (s *Server) handlePost(w http.ResponseWriter, r *http.Request) {
	var rule config.Rule
	body, err := decodeBody(w, r, &rule)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	shape := s.inspectKeys(body)
	if err := unsupportedField(shape); err != nil {
		s.writeErr(w, r, err)
		return
	}
	adminGiven := func(i int) bool {
		if i >= len(shape.Endpoints) {
			return false
		}
		_, ok := shape.Endpoints[i]["admin"]
		return ok
	}
	id, err := s.Apply(&rule, adminGiven)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.log.Info("rule applied", "rule", rule.Key().String(), "service_id", id, "endpoints", len(rule.Endpoints))
	writeJSON(w, http.StatusOK, successBody{Result: "Success", ServiceID: id})
}

// Views for GET.

type argsView struct {
	config.ServiceArguments
	ServiceID int `json:"service_id"`
}

type endpointView struct {
	EndpointIP string `json:"endpointIP"`
	TargetPort int    `json:"targetPort"`
	Weight     int    `json:"weight"`
	EPRole     int    `json:"ep_role"`
	NixlPort   int    `json:"nixl_port,omitempty"`
	EPIdx      int    `json:"ep_idx"`
	State      string `json:"state"`
	Admin      string `json:"admin"`
}

type ruleView struct {
	ServiceArguments argsView       `json:"serviceArguments"`
	Endpoints        []endpointView `json:"endpoints"`
	// Owner is the rules file that owns the rule (docs/replicas.md).
	Owner string `json:"owner,omitempty"`
}

type listView struct {
	LBAttr []ruleView `json:"lbAttr"`
}

func (s *Server) view(r *config.Rule) ruleView {
	v := ruleView{ServiceArguments: argsView{ServiceArguments: r.Args, ServiceID: r.ServiceID}, Endpoints: []endpointView{}, Owner: r.Owner}
	eps := slices.Clone(r.Endpoints)
	slices.SortFunc(eps, func(a, b config.Endpoint) int { return a.Idx - b.Idx })
	for _, e := range eps {
		state := "active"
		if s.opts.Health != nil {
			if active, known := s.opts.Health.EndpointActive(r.ServiceID, e.Idx); known && !active {
				state = "inactive"
			}
		}
		v.Endpoints = append(v.Endpoints, endpointView{
			EndpointIP: e.IP, TargetPort: e.TargetPort, Weight: e.Weight, EPRole: int(e.Role),
			NixlPort: e.NixlPort, EPIdx: e.Idx, State: state, Admin: e.Admin(),
		})
	}
	return v
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	out := listView{LBAttr: []ruleView{}}
	for _, rule := range s.Rules() {
		out.LBAttr = append(out.LBAttr, s.view(rule))
	}
	writeJSON(w, http.StatusOK, out)
}

// keyFromPath reads {ip}/{port}/{proto}.
func keyFromPath(r *http.Request) (config.RuleKey, error) {
	ipText := r.PathValue("ip")
	ip := net.ParseIP(ipText)
	if ip == nil {
		return config.RuleKey{}, badRequest("externalipaddress %q is not an IP address", ipText)
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return config.RuleKey{}, badRequest("port %q is invalid; allowed 1-65535", r.PathValue("port"))
	}
	return config.RuleKey{ExternalIP: ip.String(), Port: port, Protocol: config.EffectiveProtocol(r.PathValue("proto"))}, nil
}

func (s *Server) ruleByKey(k config.RuleKey) (*config.Rule, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rules[k]
	if !ok {
		return nil, false
	}
	return r.Clone(), true
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	k, err := keyFromPath(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	rule, ok := s.ruleByKey(k)
	if !ok {
		s.writeErr(w, r, ruleNotFound(k))
		return
	}
	writeJSON(w, http.StatusOK, listView{LBAttr: []ruleView{s.view(rule)}})
}

func (s *Server) handleGetByID(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, badRequest("id %q is not a service_id", r.PathValue("id")))
		return
	}
	rule, ok := s.RuleByID(id)
	if !ok {
		s.writeErr(w, r, &apiError{http.StatusNotFound, fmt.Sprintf("rule with service_id %d not found", id)})
		return
	}
	writeJSON(w, http.StatusOK, listView{LBAttr: []ruleView{s.view(rule)}})
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	k, err := keyFromPath(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.Delete(k); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.log.Info("rule deleted", "rule", k.String())
	writeJSON(w, http.StatusOK, successBody{Result: "Success"})
}

func (s *Server) handleDeleteByName(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var key *config.RuleKey
	for _, rule := range s.Rules() {
		if rule.Args.Name != "" && rule.Args.Name == name {
			k := rule.Key()
			key = &k
			break
		}
	}
	if key == nil {
		s.writeErr(w, r, &apiError{http.StatusNotFound, fmt.Sprintf("rule named %q not found", name)})
		return
	}
	if err := s.Delete(*key); err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, successBody{Result: "Success"})
}

func (s *Server) handleDeleteAll(w http.ResponseWriter, r *http.Request) {
	if err := s.DeleteAll(); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.log.Info("all rules deleted")
	writeJSON(w, http.StatusOK, successBody{Result: "Success"})
}

// adminBody is PUT …/endpoint: {"endpointIP":"…","targetPort":N,"admin":"up|down"}.
type adminBody struct {
	EndpointIP string  `json:"endpointIP"`
	TargetPort int     `json:"targetPort"`
	Admin      *string `json:"admin"`
}

func (s *Server) handleSetEndpoint(w http.ResponseWriter, r *http.Request) {
	var b adminBody
	k, err := keyedBody(w, r, &b)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if net.ParseIP(b.EndpointIP) == nil {
		s.writeErr(w, r, badRequest("endpointIP: %q is not an IP address", b.EndpointIP))
		return
	}
	if b.TargetPort < 1 || b.TargetPort > 65535 {
		s.writeErr(w, r, badRequest("targetPort: %d is out of range; allowed 1-65535", b.TargetPort))
		return
	}
	if b.Admin == nil || (*b.Admin != "up" && *b.Admin != "down") {
		s.writeErr(w, r, badRequest("admin: required; allowed values: up, down"))
		return
	}
	epKey := config.EndpointKey(b.EndpointIP, b.TargetPort)
	if err := s.SetAdmin(k, epKey, *b.Admin == "down"); err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.log.Info("endpoint admin state set", "rule", k.String(), "endpoint", epKey, "admin", *b.Admin)
	writeJSON(w, http.StatusOK, successBody{Result: "Success"})
}

// Inventory: the reference's raw-middleware endpoint, with its error bodies.

type invError struct {
	Error string `json:"error"`
}

func (s *Server) handleInventory(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "Method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if s.opts.Inventory == nil {
		writeJSON(w, http.StatusServiceUnavailable, invError{"kv inventory provider not registered"})
		return
	}
	q := r.URL.Query()
	sid, err := strconv.ParseUint(q.Get("service_id"), 10, 32)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, invError{"invalid service_id: " + err.Error()})
		return
	}
	epIdx, err := strconv.Atoi(q.Get("ep_idx"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, invError{"invalid ep_idx: " + err.Error()})
		return
	}
	notFound := func() { writeJSON(w, http.StatusNotFound, invError{"service or endpoint not found"}) }
	rule, ok := s.RuleByID(int(sid))
	if !ok {
		notFound()
		return
	}
	subscribed := false
	for _, e := range rule.KVEndpoints() {
		if e.Idx == epIdx {
			subscribed = true
		}
	}
	if !subscribed {
		notFound()
		return
	}
	algo, hashes, ok := s.opts.Inventory.Snapshot(int(sid), epIdx)
	if !ok {
		notFound()
		return
	}
	if algo == "" {
		algo = rule.EffectiveHashAlgo() // sha256_cbor for vLLM rules without kvHashAlgo
	}
	hashes = slices.Clone(hashes)
	slices.Sort(hashes)
	writeInventory(w, int(sid), epIdx, algo, hashes)
}

// writeInventory streams the reference's shape; hashes are full uint64 JSON
// integers, sorted, with block_idx a counter.
func writeInventory(w http.ResponseWriter, sid, epIdx int, algo string, hashes []uint64) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	algoJSON, _ := json.Marshal(algo)
	buf := make([]byte, 0, 128)
	buf = append(buf, `{"service_id":`...)
	buf = strconv.AppendInt(buf, int64(sid), 10)
	buf = append(buf, `,"ep_idx":`...)
	buf = strconv.AppendInt(buf, int64(epIdx), 10)
	buf = append(buf, `,"hash_algo":`...)
	buf = append(buf, algoJSON...)
	buf = append(buf, `,"blocks":[`...)
	_, _ = bw.Write(buf)
	for i, h := range hashes {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"block_idx":`...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, `,"hash_uint64":`...)
		buf = strconv.AppendUint(buf, h, 10)
		buf = append(buf, '}')
		if _, err := bw.Write(buf); err != nil {
			return // client gone
		}
	}
	buf = append(buf[:0], `],"total":`...)
	buf = strconv.AppendInt(buf, int64(len(hashes)), 10)
	buf = append(buf, "}\n"...)
	_, _ = bw.Write(buf)
	_ = bw.Flush()
}
