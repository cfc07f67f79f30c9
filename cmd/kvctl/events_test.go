package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEventsDecodeVectors decodes every vLLM event vector payload with
// kvctl events decode (via --hex and --file) and checks the JSON shape.
func TestEventsDecodeVectors(t *testing.T) {
	raw, err := os.ReadFile("../../pkg/kvevents/testdata/vllm_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Payloads []struct {
			Name       string          `json:"name"`
			PayloadHex string          `json:"payload_hex"`
			Decoded    json.RawMessage `json:"decoded"`
		} `json:"payloads"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, p := range v.Payloads {
		t.Run(p.Name, func(t *testing.T) {
			args := []string{"events", "decode", "--hex", p.PayloadHex}
			if i%2 == 1 {
				path := filepath.Join(dir, "payload.bin")
				b, _ := hex.DecodeString(p.PayloadHex)
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
				args = []string{"events", "decode", "--file", path}
			}
			stdout, stderr, err := parityRun(t, args...)
			if err != nil {
				t.Fatalf("%v (%s)", err, stderr)
			}
			if strings.Count(stdout, "\n") != 1 {
				t.Fatalf("want one JSON line: %q", stdout)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatal(err)
			}
			keys := []string{"ts", "data_parallel_rank", "events"}
			if len(got) != len(keys) {
				t.Errorf("top-level keys %v", got)
			}
			var outer []json.RawMessage
			_ = json.Unmarshal(p.Decoded, &outer)
			if string(got["ts"]) != "1757500000.25" {
				t.Errorf("ts %s", got["ts"])
			}
			wantRank := "null"
			if len(outer) == 3 {
				wantRank = string(outer[2])
			}
			if string(got["data_parallel_rank"]) != wantRank {
				t.Errorf("rank %s, want %s", got["data_parallel_rank"], wantRank)
			}
			var events []map[string]json.RawMessage
			if err := json.Unmarshal(got["events"], &events); err != nil {
				t.Fatal(err)
			}
			var wantEvents []json.RawMessage
			_ = json.Unmarshal(outer[1], &wantEvents)
			if len(events) != len(wantEvents) {
				t.Fatalf("%d events, want %d", len(events), len(wantEvents))
			}
			for j, e := range events {
				for _, k := range []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "lora_name"} {
					if _, ok := e[k]; !ok {
						t.Errorf("event %d lacks %q", j, k)
					}
				}
				if len(e) != 7 {
					t.Errorf("event %d has keys %v", j, e)
				}
				// Field values as the vector's decoded form has them (map
				// events by name; array events by position).
				want := map[string]json.RawMessage{}
				if bytes.HasPrefix(bytes.TrimSpace(wantEvents[j]), []byte("{")) {
					_ = json.Unmarshal(wantEvents[j], &want)
				} else {
					var arr []json.RawMessage
					_ = json.Unmarshal(wantEvents[j], &arr)
					want["type"] = arr[0]
					names := map[string][]string{
						`"BlockStored"`:  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
						`"BlockRemoved"`: {"block_hashes", "medium"},
					}[string(arr[0])]
					for k, name := range names {
						if k+1 < len(arr) {
							want[name] = arr[k+1]
						}
					}
				}
				for _, k := range []string{"type", "parent_block_hash", "token_ids", "block_size", "medium", "lora_name"} {
					w, ok := want[k]
					if !ok {
						continue
					}
					if compact(w) != compact(e[k]) {
						t.Errorf("event %d %s = %s, want %s", j, k, e[k], w)
					}
				}
				if w := want["block_hashes"]; w != nil && !strings.Contains(string(w), "$bytes_hex") && compact(w) != compact(e["block_hashes"]) {
					t.Errorf("event %d block_hashes = %s, want %s", j, e["block_hashes"], w)
				}
			}
		})
	}
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

func TestEventsDecodeBytesHashes(t *testing.T) {
	// map/block_stored_bytes_hash_lora: the hash is the trailing 8 bytes of the digest.
	const payload = "93cb41da305498100000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c420b4a0ac42140b59b5630946d5b8d7f84e20507e39aa22d8cfd3eb9b4d6eb59c30b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0010cd2dcacd0b74ce000130fbcd06a3cd6a94cd3356ce000188f7cd1610cdb5d4ce00020cc3cd7dd9cd2515ce00010f09ce00011d13ce00020e48cd8d7daa626c6f636b5f73697a6510a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d65a76d792d6c6f7261aa65787472615f6b6579739191a76d792d6c6f7261a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
	stdout, _, err := parityRun(t, "events", "decode", "--hex", " 0x"+payload[:40]+"\n"+payload[40:])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"block_hashes":[15270469718401981488]`, `"lora_name":"my-lora"`, `"medium":"GPU"`, `"block_size":16`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %s: %s", want, stdout)
		}
	}
}

func TestEventsDecodeBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.bin")
	if err := os.WriteFile(garbage, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		flag string
	}{
		{"bad hex", []string{"--hex", "zz"}, "--hex"},
		{"odd hex", []string{"--hex", "939"}, "--hex"},
		{"empty hex", []string{"--hex", ""}, "--hex"},
		{"not a batch", []string{"--hex", "a568656c6c6f"}, "--hex"},
		{"truncated", []string{"--hex", "93cb41da30549810"}, "--hex"},
		{"neither", nil, "--hex"},
		{"both", []string{"--hex", "90", "--file", garbage}, "--file"},
		{"missing file", []string{"--file", filepath.Join(dir, "nope")}, "--file"},
		{"garbage file", []string{"--file", garbage}, "--file"},
		{"positional argument", []string{"--hex", "90", "91"}, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := parityRun(t, append([]string{"events", "decode"}, tt.args...)...)
			if parityExitCode(err) != 2 || !strings.Contains(err.Error(), tt.flag) {
				t.Fatalf("err %v (exit %d), want exit 2 naming %s", err, parityExitCode(err), tt.flag)
			}
			if stdout != "" {
				t.Errorf("printed %q", stdout)
			}
		})
	}
}

// Unknown events are skipped and reported on stderr, not fatal.
func TestEventsDecodeSkipsUnknown(t *testing.T) {
	// [1.0, [{"type":"Future"}, ["AllBlocksCleared"]], nil]
	payload := "93cb3ff00000000000009281a474797065a646757475726591b0416c6c426c6f636b73436c6561726564c0"
	stdout, stderr, err := parityRun(t, "events", "decode", "--hex", payload)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, `"events":[{"type":"AllBlocksCleared"`) || !strings.Contains(stdout, `"data_parallel_rank":null`) {
		t.Errorf("stdout %s", stdout)
	}
	if !strings.Contains(stderr, "skipped 1 unknown event") {
		t.Errorf("stderr %q", stderr)
	}
}

// Values decoded by python3-msgpack print as such: a present "" medium and
// lora_name stay "", a nil block_size is null, and a malformed rank prints
// null without losing the batch's events.
func TestEventsDecodeEdgeValues(t *testing.T) {
	tests := []struct {
		name, hex, want string
	}{
		{
			"empty strings",
			"93cb3ff00000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739101b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da0a96c6f72615f6e616d65a000",
			`{"ts":1,"data_parallel_rank":0,"events":[{"type":"BlockStored","block_hashes":[1],"parent_block_hash":null,"token_ids":[1,2],"block_size":2,"medium":"","lora_name":""}]}` + "\n",
		},
		{
			"nil block_size, negative rank",
			"93cb3ff00000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739101b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a65c0a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0ff",
			`{"ts":1,"data_parallel_rank":null,"events":[{"type":"BlockStored","block_hashes":[1],"parent_block_hash":null,"token_ids":[1,2],"block_size":null,"medium":"GPU","lora_name":null}]}` + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := parityRun(t, "events", "decode", "--hex", tt.hex)
			if err != nil {
				t.Fatal(err)
			}
			if stdout != tt.want {
				t.Errorf("got  %s\nwant %s", stdout, tt.want)
			}
		})
	}
}

// TestEventsDecodeEngines decodes the SGLang and TensorRT-LLM payload
// vectors (generated from the engines' own code) through kvctl.
func TestEventsDecodeEngines(t *testing.T) {
	var sg struct {
		Cases []struct {
			Name   string `json:"name"`
			Hex    string `json:"hex"`
			Expect struct {
				Events []struct {
					Hashes []int64 `json:"block_hashes"`
				} `json:"events"`
			} `json:"expect"`
		} `json:"cases"`
	}
	var trt struct {
		Cases []struct {
			Name string `json:"name"`
			Body string `json:"body"`
		} `json:"cases"`
	}
	for path, v := range map[string]any{
		"../../pkg/kvevents/sglang/testdata/sglang_event_vectors.json": &sg,
		"../../pkg/kvevents/trtllm/testdata/trtllm_event_vectors.json": &trt,
	} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	type out struct {
		Engine string `json:"engine"`
		Events []struct {
			Hashes []int64 `json:"block_hashes"`
			Data   struct {
				Type string `json:"type"`
			} `json:"data"`
		} `json:"events"`
	}
	for _, c := range sg.Cases {
		t.Run("sglang/"+c.Name, func(t *testing.T) {
			stdout, stderr, err := parityRun(t, "events", "decode", "--engine", "sglang", "--hex", c.Hex)
			if err != nil {
				t.Fatalf("%v (%s)", err, stderr)
			}
			var o out
			if err := json.Unmarshal([]byte(stdout), &o); err != nil {
				t.Fatal(err)
			}
			if o.Engine != "sglang" || len(o.Events) != len(c.Expect.Events) {
				t.Fatalf("engine %q, %d events, want %d", o.Engine, len(o.Events), len(c.Expect.Events))
			}
			for i, e := range o.Events {
				if len(e.Hashes) != len(c.Expect.Events[i].Hashes) || (len(e.Hashes) > 0 && e.Hashes[0] != c.Expect.Events[i].Hashes[0]) {
					t.Errorf("event %d hashes %v, want %v (signed)", i, e.Hashes, c.Expect.Events[i].Hashes)
				}
			}
		})
	}
	for _, c := range trt.Cases {
		t.Run("trtllm/"+c.Name, func(t *testing.T) {
			stdout, stderr, err := parityRun(t, "events", "decode", "--engine", "trtllm", "--json", c.Body)
			if err != nil {
				t.Fatalf("%v (%s)", err, stderr)
			}
			var o struct {
				Engine string            `json:"engine"`
				Events []json.RawMessage `json:"events"`
			}
			if err := json.Unmarshal([]byte(stdout), &o); err != nil {
				t.Fatal(err)
			}
			var in []json.RawMessage
			_ = json.Unmarshal([]byte(c.Body), &in)
			if o.Engine != "trtllm" || len(o.Events) != len(in) {
				t.Errorf("engine %q, %d events, want %d", o.Engine, len(o.Events), len(in))
			}
			// uint64 hashes above 2^63 print exactly.
			for _, tok := range []string{"12809241085271551977", "14414521608364276088"} {
				if strings.Contains(c.Body, tok) && !strings.Contains(stdout, tok) {
					t.Errorf("hash %s lost", tok)
				}
			}
		})
	}
	bad := []struct {
		name string
		args []string
		flag string
	}{
		{"unknown engine", []string{"--engine", "tgi", "--hex", "90"}, "--engine"},
		{"trtllm takes no hex", []string{"--engine", "trtllm", "--hex", "90"}, "--hex"},
		{"vllm takes no json", []string{"--json", "[]"}, "--json"},
		{"sglang takes no json", []string{"--engine", "sglang", "--json", "[]"}, "--json"},
		{"trtllm needs input", []string{"--engine", "trtllm"}, "--json"},
		{"trtllm json and file", []string{"--engine", "trtllm", "--json", "[]", "--file", "x"}, "--file"},
		{"trtllm bad body", []string{"--engine", "trtllm", "--json", `{"a":1}`}, "--json"},
		{"trtllm unknown type", []string{"--engine", "trtllm", "--json", `[{"data":{"type":"x"}}]`}, "--json"},
		{"sglang not a batch", []string{"--engine", "sglang", "--hex", "a161"}, "--hex"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := parityRun(t, append([]string{"events", "decode"}, tt.args...)...)
			if parityExitCode(err) != 2 || !strings.Contains(err.Error(), tt.flag) || stdout != "" {
				t.Errorf("exit %d err %v stdout %q, want 2 naming %s", parityExitCode(err), err, stdout, tt.flag)
			}
		})
	}
}
