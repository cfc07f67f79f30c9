package main

// Rule commands over the management API: create lb, get lb, delete lb, and
// the shared API client used by the other API commands (endpoint.go,
// inventory.go, metrics.go).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/selector"
	"github.com/spf13/cobra"
)

const defaultAPIServer = "http://127.0.0.1:11111"

func init() {
	for _, c := range newAPICommands() {
		root.AddCommand(c)
	}
}

// newAPICommands builds the verb groups (create, get, delete, set) with their
// API subcommands. Tests build a fresh tree per run, so flag values never
// leak from one invocation to the next.
func newAPICommands() []*cobra.Command {
	group := func(use, short string, subs ...*cobra.Command) *cobra.Command {
		c := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				return badInput("%s: name what to %s; see kvctl %s --help", use, use, use)
			}}
		addAPIFlags(c.PersistentFlags())
		c.AddCommand(subs...)
		return c
	}
	return []*cobra.Command{
		group("create", "Create objects through the kvgate management API", newCreateLBCmd()),
		group("get", "Show objects from the kvgate management API", newGetLBCmd(), newGetInventoryCmd(), newGetMetricsCmd()),
		group("delete", "Delete objects through the kvgate management API", newDeleteLBCmd()),
		group("set", "Change objects through the kvgate management API", newSetEndpointCmd()),
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// apiClient talks to kvgate's management API.
type apiClient struct {
	base  string
	http  *http.Client
	token string // sent as Authorization: Bearer when set
}

// callAPI sends one request to the API server the command names and
// returns the body of a 2xx answer.
func callAPI(cmd *cobra.Command, method, path string, body any) ([]byte, error) {
	cl, err := newAPIClient(cmd)
	if err != nil {
		return nil, err
	}
	return cl.do(method, path, body)
}

// apiError is an error answer of the API, printed readably.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("API error %d %s: %s%s", e.status, http.StatusText(e.status), e.msg, authHint(e.status))
}

// do sends a request and returns the body of a 2xx answer.
func (c *apiClient) do(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, explainTransport(c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("reading the API answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, &apiError{status: resp.StatusCode, msg: errorMessage(b)}
	}
	return b, nil
}

// errorMessage pulls the message out of either error shape the API uses:
// {"code":N,"message":"…"} or {"error":"…"}.
func errorMessage(b []byte) string {
	var e struct {
		Message string `json:"message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil {
		if e.Message != "" {
			return e.Message
		}
		if e.Error != "" {
			return e.Error
		}
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(no message)"
	}
	return s
}

// Wire types: the JSON the API takes and gives (LoxiLB's names).

// lbArgs is serviceArguments as the API gives it: the rule model's fields
// plus the service_id GET adds.
type lbArgs struct {
	config.ServiceArguments
	ServiceID int `json:"service_id,omitempty"`
}

// lbEndpoint is an endpoint on the wire. admin is sent only when given, so
// re-running create lb for an existing rule keeps drained endpoints down.
type lbEndpoint struct {
	EndpointIP string `json:"endpointIP"`
	TargetPort int    `json:"targetPort"`
	Weight     int    `json:"weight"`
	EPRole     int    `json:"ep_role"`
	NixlPort   int    `json:"nixl_port,omitempty"`
	Admin      string `json:"admin,omitempty"`
	EPIdx      *int   `json:"ep_idx,omitempty"`
	State      string `json:"state,omitempty"`
}

type lbRule struct {
	ServiceArguments lbArgs       `json:"serviceArguments"`
	Endpoints        []lbEndpoint `json:"endpoints"`
}

// Name tables of loxicmd.

var lbModes = map[string]int{"default": 0, "onearm": 1, "fullnat": 2, "dsr": 3, "fullproxy": 4, "hostonearm": 5}

var epRoles = map[string]int{"normal": 0, "none": 0, "prefill": 1, "decode": 2}

func nameOf(table map[string]int, v int) string {
	best := ""
	for k, n := range table {
		if n == v && (best == "" || k < best) {
			best = k
		}
	}
	if best == "" {
		return strconv.Itoa(v)
	}
	return best
}

// lookupName accepts a table name or its number.
func lookupName(flag, v string, table map[string]int, allowed string) (int, error) {
	if n, ok := table[strings.ToLower(strings.TrimSpace(v))]; ok {
		return n, nil
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		for _, m := range table {
			if m == n {
				return n, nil
			}
		}
	}
	return 0, badInput("--%s %q: allowed values: %s", flag, v, allowed)
}

// ruleAddress reads a rule's EXTERNAL-IP argument and its --tcp flag for
// command verb ("create lb"): PORT:TARGETPORT when withTarget, else PORT.
func ruleAddress(verb, ipArg, tcp string, withTarget bool) (ip string, port, target int, err error) {
	if ip, err = parseIP("EXTERNAL-IP", ipArg); err != nil {
		return "", 0, 0, err
	}
	if tcp == "" {
		form := "PORT"
		if withTarget {
			form = "PORT:TARGETPORT"
		}
		return "", 0, 0, badInput("%s: --tcp=%s is required", verb, form)
	}
	port, target, err = parsePortPair(tcp, withTarget)
	return ip, port, target, err
}

// rulePath is the management API path of the TCP rule ip:port.
func rulePath(ip string, port int) string {
	return fmt.Sprintf("/netlox/v1/config/loadbalancer/externalipaddress/%s/port/%d/protocol/tcp", url.PathEscape(ip), port)
}

// parsePortPair reads --tcp=PORT:TARGETPORT (or PORT alone for delete).
func parsePortPair(v string, needTarget bool) (port, target int, err error) {
	if strings.Contains(v, ",") {
		return 0, 0, badInput("--tcp %q: one PORT:TARGETPORT pair per rule", v)
	}
	p, t, hasTarget := strings.Cut(v, ":")
	port, err1 := strconv.Atoi(p)
	if err1 != nil || port < 1 || port > 65535 {
		return 0, 0, badInput("--tcp %q: PORT must be 1-65535", v)
	}
	if !hasTarget {
		if needTarget {
			return 0, 0, badInput("--tcp %q: want PORT:TARGETPORT", v)
		}
		return port, 0, nil
	}
	target, err2 := strconv.Atoi(t)
	if err2 != nil || target < 1 || target > 65535 {
		return 0, 0, badInput("--tcp %q: TARGETPORT must be 1-65535", v)
	}
	return port, target, nil
}

// splitHostPart splits "ip:x" or "[v6]:x" at the last colon.
func splitHostPart(s string) (host, part string, ok bool) {
	if strings.HasPrefix(s, "[") {
		h, p, err := net.SplitHostPort(s)
		return h, p, err == nil
	}
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// parseLoraAdapters splits --kv-lora-adapters=a,b=base,...; the API
// validates each entry.
func parseLoraAdapters(v string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, badInput("--kv-lora-adapters %q has an empty entry; want NAME[=BASE-MODEL],...", v)
		}
		out = append(out, a)
	}
	return out, nil
}

// parseLoraTaskIDs reads --kv-lora-task-ids=NAME=ID,...; the API checks
// the names against kvLoraAdapters.
func parseLoraTaskIDs(v string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, e := range strings.Split(v, ",") {
		name, id, ok := strings.Cut(strings.TrimSpace(e), "=")
		n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 64)
		if !ok || name == "" || err != nil {
			return nil, badInput("--kv-lora-task-ids entry %q: want NAME=TASK-ID (0-18446744073709551615),...", e)
		}
		out[name] = n
	}
	return out, nil
}

func parseIP(flag, v string) (string, error) {
	ip := net.ParseIP(strings.TrimSpace(v))
	if ip == nil {
		return "", badInput("%s %q is not an IP address", flag, v)
	}
	return ip.String(), nil
}

func newCreateLBCmd() *cobra.Command {
	var (
		tcp, endpoints, mode, sel, epRole, nixlPorts, name             string
		kvHashAlgo, kvEngine, kvHashSeed, probeType, probeReq          string
		kvLoraAdapters, kvLoraTaskIDs                                  string
		kvExact, kvZmq, kvBlock, kvWarmup, kvRanks, kvReplay           int
		pdTTL, pdThreshold, pdBalance, pdBootstrap                     int
		chwblLevel, chwblFlags, chwblFactor, chwblRepl                 int
		probePort, probeTimeout, probeRetries, probeInterval           int
		pdDisagg, pdCacheAware, cbEnable, chwblSalt, pdReceipt, asJSON bool
		wildcardVIP, trustTemplate                                     bool
		backendTokenFile                                               string
		tlsFlags                                                       lbTLSFlags
	)
	c := &cobra.Command{
		Use:     "lb EXTERNAL-IP --tcp=PORT:TARGETPORT --endpoints=IP:WEIGHT,...",
		Aliases: []string{"loadbalancer"},
		Short:   "Create (or update) a load-balancer rule",
		Long: `Create a load-balancer rule, as loxicmd create lb does. Posting an existing
EXTERNAL-IP/PORT/tcp again updates the rule: endpoints that stay keep their
ep_idx, inventory and subscriber.

Example (the rule of docs/api.md, a vLLM P/D pool with KV-aware prefill selection):
  kvctl create lb 10.10.10.254 --tcp=8080:8000 --endpoints=192.0.2.1:1,192.0.2.2:1 \
    --mode=fullproxy --select=persist --kv-exact-mode=1 --kv-zmq-port=5557 \
    --kv-hash-algo=sha256_cbor --kv-block-size=16 --kv-warmup=30 --ep-role=prefill,decode`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ip, port, target, err := ruleAddress("create lb", args[0], tcp, true)
			if err != nil {
				return err
			}
			m, err := lookupName("mode", mode, lbModes, "default, onearm, fullnat, dsr, fullproxy, hostonearm (or 0-5)")
			if err != nil {
				return err
			}
			s, err := selector.ParseSel(sel)
			if err != nil {
				return badInput("--select %q: allowed values: %s", sel, selector.SelAllowed)
			}
			eps, err := parseEndpoints(endpoints, target, epRole, nixlPorts)
			if err != nil {
				return err
			}
			rule := lbRule{Endpoints: eps, ServiceArguments: lbArgs{ServiceArguments: config.ServiceArguments{
				ExternalIP: ip, Port: port, Protocol: "tcp", Sel: s, Mode: m, Name: name, WildcardVIP: wildcardVIP,
				KVExactMode: kvExact, KVZmqPort: kvZmq, KVHashAlgo: kvHashAlgo, KVBlockSize: kvBlock, KVWarmupSec: kvWarmup,
				KVEngineType: kvEngine, KVDpRankCount: kvRanks, KVReplayPort: kvReplay,
				PDBootstrapPort: pdBootstrap, PDDisaggMode: pdDisagg, PDCacheAwareMode: pdCacheAware, PDSessionTTLSec: pdTTL,
				PDCacheThreshold: pdThreshold, PDBalanceAbsThreshold: pdBalance, CBEnable: cbEnable, PDRequestIDReceipt: pdReceipt,
				CHWBLMeanLoadFactor: chwblFactor, CHWBLReplication: chwblRepl, CHWBLPrefixHashLevel: chwblLevel,
				CHWBLPrefixHashFlags: chwblFlags, CHWBLEnableCacheSalt: chwblSalt,
				ProbeType: probeType, ProbePort: probePort, ProbeReq: probeReq, ProbeTimeout: probeTimeout,
				ProbeRetries: probeRetries, ProbeInterval: probeInterval, TrustRequestChatTemplate: trustTemplate,
			}}}
			if cmd.Flags().Changed("kv-lora-adapters") {
				if rule.ServiceArguments.KVLoraAdapters, err = parseLoraAdapters(kvLoraAdapters); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("kv-lora-task-ids") {
				if rule.ServiceArguments.KVLoraTaskIDs, err = parseLoraTaskIDs(kvLoraTaskIDs); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("kv-hash-seed") {
				rule.ServiceArguments.KVHashSeed = &kvHashSeed
			}
			rule.ServiceArguments.BackendTokenFile = backendTokenFile
			if err := tlsFlags.apply(&rule.ServiceArguments.ServiceArguments); err != nil {
				return err
			}
			b, err := callAPI(cmd, http.MethodPost, "/netlox/v1/config/loadbalancer", rule)
			if err != nil {
				return err
			}
			if asJSON {
				_, err := cmd.OutOrStdout().Write(b)
				return err
			}
			var ok struct {
				ServiceID int `json:"service_id"`
			}
			_ = json.Unmarshal(b, &ok)
			fmt.Fprintf(cmd.OutOrStdout(), "Success: rule %s:%d/tcp has service_id %d\n", ip, port, ok.ServiceID)
			return nil
		},
	}
	f := c.Flags()
	addLBTLSFlags(f, &tlsFlags)
	f.StringVar(&tcp, "tcp", "", "PORT:TARGETPORT: the rule's port and the endpoints' port (required)")
	f.StringVar(&endpoints, "endpoints", "", "endpoints as IP:WEIGHT,... (IPv6 as [IP]:WEIGHT)")
	f.StringVar(&mode, "mode", "default", "LB mode: default|onearm|fullnat|dsr|fullproxy|hostonearm; KV and P/D rules need fullproxy")
	f.StringVar(&sel, "select", "rr", "endpoint selector (mode-3 fallback): rr|hash|priority|persist|lc|n2|n3|chwbl|gpuaware|wrr-hash")
	f.StringVar(&name, "name", "", "rule name (1-256 printable ASCII characters)")
	f.BoolVar(&wildcardVIP, "wildcard-vip", false, "allow EXTERNAL-IP 0.0.0.0 or ::, which listens on every interface of the host")
	f.IntVar(&kvExact, "kv-exact-mode", 0, "KV-exact mode: 0 off, 1 P/D pool (prefill endpoints scored), 3 single pool")
	f.IntVar(&kvZmq, "kv-zmq-port", 0, "workers' KV-event PUB port (0 = 5557); rank r uses port+r")
	f.StringVar(&kvHashAlgo, "kv-hash-algo", "", "block-hash algorithm: sha256_cbor|xxhash_cbor|sha256|xxhash (default from the engine: sha256_cbor)")
	f.IntVar(&kvBlock, "kv-block-size", 0, "tokens per block; must equal vLLM --block-size (0 = 16)")
	f.IntVar(&kvWarmup, "kv-warmup", 0, "kvWarmupSec: stored, inert (as in the spec)")
	f.StringVar(&kvEngine, "kv-engine-type", "", "engine: vllm|sglang|trtllm|llamacpp (llamacpp without KV fields)")
	f.IntVar(&kvRanks, "kv-dp-ranks", 0, "kvDpRankCount: data-parallel ranks per endpoint, 1-8")
	f.IntVar(&kvReplay, "kv-replay-port", 0, "KV-event replay port (0 = kv-zmq-port + LLB_KV_REPLAY_PORT_OFFSET)")
	f.StringVar(&kvHashSeed, "kv-hash-seed", "", "NONE_HASH seed for this rule (vLLM's PYTHONHASHSEED); overrides LLB_KV_NONE_HASH_SEED")
	f.BoolVar(&trustTemplate, "trust-request-chat-template", false, "render a request's own chat_template to route it (set it when the engines run vLLM's --trust-request-chat-template); off, such requests are forwarded unrouted under reason tokenize")
	f.StringVar(&kvLoraTaskIDs, "kv-lora-task-ids", "", "kvEngineType trtllm: each adapter's TensorRT-LLM lora_task_id, NAME=ID,... (block keys mix the task id, not the name)")
	f.StringVar(&kvLoraAdapters, "kv-lora-adapters", "", "LoRA adapters the engines serve, NAME[=BASE-MODEL],...: a request for NAME hashes with its lora_name; its prompt is tokenized with BASE-MODEL's staged tokenizer (default: one staged under NAME)")
	f.StringVar(&epRole, "ep-role", "", "per-endpoint roles aligned with --endpoints: normal|prefill|decode|0|1|2")
	f.StringVar(&nixlPorts, "nixl-port", "", "per-endpoint NIXL ports aligned with --endpoints (0 = target port)")
	f.BoolVar(&pdDisagg, "pd-disagg", false, "P/D disaggregation (implied by --kv-exact-mode=1)")
	f.BoolVar(&pdCacheAware, "pd-cache-aware", false, "Tier-1 trie affinity (needs P/D)")
	f.IntVar(&pdTTL, "pd-session-ttl", 0, "Tier-1 session TTL in seconds, sliding (0 = 300)")
	f.IntVar(&pdThreshold, "pd-cache-threshold", 0, "trie match-rate percentage, 0-100 (0 = 20)")
	f.IntVar(&pdBalance, "pd-balance-abs-threshold", 0, "max-min prefill load spread gate (0 = 3)")
	f.IntVar(&pdBootstrap, "pd-bootstrap-port", 0, "SGLang bootstrap port (not supported yet)")
	f.BoolVar(&pdReceipt, "pd-request-id-receipt", false, "use the ___prefill_addr_…___decode_addr_… X-Request-Id receipt (P2P-NCCL connectors)")
	f.BoolVar(&cbEnable, "cb-enable", false, "per-endpoint circuit breaker (always on for P/D rules)")
	f.IntVar(&chwblLevel, "chwbl-hash-level", 0, "CHWBL ring prefix hash level 1-3 (sel chwbl only; stored)")
	f.IntVar(&chwblFlags, "chwbl-hash-flags", 0, "CHWBL ring prefix hash flags 0-255 (stored)")
	f.IntVar(&chwblFactor, "chwbl-load-factor", 0, "CHWBL ring mean load factor 100-300 (stored)")
	f.IntVar(&chwblRepl, "chwbl-replication", 0, "CHWBL ring replication 1-1024 (stored)")
	f.BoolVar(&chwblSalt, "chwbl-cache-salt", false, "CHWBL ring cache salt (stored)")
	f.StringVar(&probeType, "probetype", "", "health probe: http|tcp|none (default http for KV/P-D rules, tcp otherwise)")
	f.IntVar(&probePort, "probeport", 0, "probe port (0 = target port)")
	f.StringVar(&probeReq, "probereq", "", "HTTP probe path (default /health)")
	f.IntVar(&probeTimeout, "probetimeout", 0, "probe timeout in seconds (0 = 2)")
	f.IntVar(&probeRetries, "proberetries", 0, "consecutive failures that mark an endpoint down (0 = 2)")
	f.IntVar(&probeInterval, "probeinterval", 0, "seconds between probes (0 = 5)")
	f.StringVar(&backendTokenFile, "backend-token-file", "", "backendTokenFile: absolute path, on kvgate's host and in its --backend-token-dir, of a mode-0600 file holding the engines' key (vLLM --api-key), sent on kvgate's own probes, scrapes and preflight calls, never on clients' requests")
	f.BoolVarP(&asJSON, "json", "j", false, "print the API's JSON answer")
	return c
}

// parseEndpoints reads --endpoints with the aligned --ep-role and --nixl-port lists.
func parseEndpoints(list string, target int, roles, nixl string) ([]lbEndpoint, error) {
	var eps []lbEndpoint
	if strings.TrimSpace(list) != "" {
		for _, item := range strings.Split(list, ",") {
			host, w, ok := splitHostPart(strings.TrimSpace(item))
			if !ok {
				return nil, badInput("--endpoints %q: want IP:WEIGHT", item)
			}
			ip, err := parseIP("--endpoints", host)
			if err != nil {
				return nil, err
			}
			weight, err := strconv.Atoi(w)
			if err != nil || weight < 0 || weight > 255 {
				return nil, badInput("--endpoints %q: WEIGHT must be 0-255", item)
			}
			eps = append(eps, lbEndpoint{EndpointIP: ip, TargetPort: target, Weight: weight})
		}
	}
	if roles != "" {
		rs := strings.Split(roles, ",")
		if len(rs) != len(eps) {
			return nil, badInput("--ep-role has %d values for %d endpoints; give one per endpoint", len(rs), len(eps))
		}
		for i, r := range rs {
			n, err := lookupName("ep-role", r, epRoles, "normal, prefill, decode (or 0, 1, 2)")
			if err != nil {
				return nil, err
			}
			eps[i].EPRole = n
		}
	}
	if nixl != "" {
		ps := strings.Split(nixl, ",")
		if len(ps) != len(eps) {
			return nil, badInput("--nixl-port has %d values for %d endpoints; give one per endpoint", len(ps), len(eps))
		}
		for i, p := range ps {
			n, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || n < 0 || n > 65535 {
				return nil, badInput("--nixl-port %q: want 0-65535", p)
			}
			eps[i].NixlPort = n
		}
	}
	return eps, nil
}

func newGetLBCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:     "lb",
		Aliases: []string{"loadbalancer"},
		Short:   "List load-balancer rules with their service_id and endpoints (ep_idx, state, admin)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := callAPI(cmd, http.MethodGet, "/netlox/v1/config/loadbalancer/all", nil)
			if err != nil {
				return err
			}
			if asJSON {
				_, err := cmd.OutOrStdout().Write(b)
				return err
			}
			var list struct {
				LBAttr []lbRule `json:"lbAttr"`
			}
			if err := json.Unmarshal(b, &list); err != nil {
				return fmt.Errorf("decoding the API answer: %w", err)
			}
			return printRules(cmd.OutOrStdout(), list.LBAttr)
		},
	}
	c.Flags().BoolVarP(&asJSON, "json", "j", false, "print the API's JSON")
	return c
}

func printRules(out io.Writer, rules []lbRule) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE_ID\tEXT_IP\tPORT\tPROTO\tSEL\tMODE\tKV_MODE\tEP_IDX\tENDPOINT\tEPORT\tWEIGHT\tROLE\tSTATE\tADMIN")
	for _, r := range rules {
		a := r.ServiceArguments
		head := fmt.Sprintf("%d\t%s\t%d\t%s\t%s\t%s\t%d", a.ServiceID, a.ExternalIP, a.Port, a.Protocol,
			a.Sel, nameOf(lbModes, a.Mode), a.KVExactMode)
		if len(r.Endpoints) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\n", head)
		}
		for _, e := range r.Endpoints {
			idx := "-"
			if e.EPIdx != nil {
				idx = strconv.Itoa(*e.EPIdx)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", head, idx, e.EndpointIP, e.TargetPort, e.Weight,
				nameOf(epRoles, e.EPRole), e.State, e.Admin)
		}
	}
	return tw.Flush()
}

func newDeleteLBCmd() *cobra.Command {
	var tcp string
	var all bool
	c := &cobra.Command{
		Use:     "lb EXTERNAL-IP --tcp=PORT",
		Aliases: []string{"loadbalancer"},
		Short:   "Delete a load-balancer rule (or every rule with --all)",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := newAPIClient(cmd)
			if err != nil {
				return err
			}
			if all {
				if len(args) != 0 || tcp != "" {
					return badInput("--all takes no EXTERNAL-IP or --tcp")
				}
				if _, err := cl.do(http.MethodDelete, "/netlox/v1/config/loadbalancer/all", nil); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "Success: all rules deleted")
				return nil
			}
			if len(args) != 1 {
				return badInput("delete lb: give EXTERNAL-IP (or --all)")
			}
			if tcp == "" { // reported before a bad EXTERNAL-IP
				return badInput("delete lb: --tcp=PORT is required")
			}
			ip, port, _, err := ruleAddress("delete lb", args[0], tcp, false)
			if err != nil {
				return err
			}
			if _, err := cl.do(http.MethodDelete, rulePath(ip, port), nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Success: rule %s:%d/tcp deleted\n", ip, port)
			return nil
		},
	}
	c.Flags().StringVar(&tcp, "tcp", "", "the rule's PORT (PORT:TARGETPORT is accepted too)")
	c.Flags().BoolVar(&all, "all", false, "delete every rule")
	return c
}
