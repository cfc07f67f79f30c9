package main

import (
	"encoding/hex"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/kvevents"
	"github.com/kvgate/kvgate/pkg/kvevents/sglang"
	"github.com/kvgate/kvgate/pkg/kvevents/trtllm"
)

// eventsCmd groups the KV-event tools; later subcommands (watch, replay)
// attach to it.
var eventsCmd = &cobra.Command{
	Use:   "events",
	Short: "Decode and inspect vLLM, SGLang and TensorRT-LLM KV-event payloads",
	Args:  cobra.NoArgs,
}

func init() {
	decode := &cobra.Command{
		Use:   "decode [--engine vllm|sglang|trtllm] (--hex H | --json J | --file F)",
		Short: "Decode one KV-event batch payload (ZMQ frame 3, or a TensorRT-LLM drain) to JSON",
		Long: `decode reads one msgpack EventBatch payload - the third frame of a vLLM
KV-event message - and prints it as one JSON object:

  {"ts":<float>,"data_parallel_rank":<int|null>,"events":[{"type":"BlockStored",
   "block_hashes":[<uint64>...],"parent_block_hash":<uint64|null>,"token_ids":[...],
   "block_size":<int|null>,"medium":<string|null>,"lora_name":<string|null>}, ...]}

Every event has these keys; values an event type does not carry are null (or
[]), and so is a block_size that is nil or outside 0..2^32-1. Token ids
outside 0..2^32-1 drop the event's token_ids ([]); a data_parallel_rank that
is not an integer in 0..2^31-1 prints null. Such values are counted on stderr
as malformed fields. Both the map layout of vLLM >= 0.26 and the older array layouts decode;
block hashes sent as bytes print as their trailing 8 bytes. Unknown fields and
event types are skipped (counted on stderr).

--engine sglang decodes SGLang's payload (--hex or --file) in either wire
shape, legacy tagged arrays or tagged maps, and prints
  {"engine":"sglang","ts":..,"attn_dp_rank":<int|null>,"events":[{"type":..,
   "shape":"array"|"map","block_hashes":[<int64>...],"parent_block_hash":<int64|null>,
   "token_ids":[...],"block_size":..,"lora_id":..,"medium":..,"cache_salt":..,
   "session_id":..,"lora_name":..}]}
with hashes signed, as SGLang publishes them. --engine trtllm decodes the
body of trtllm-serve's POST /kv_cache_events (--json or --file) and prints
  {"engine":"trtllm","events":[<the events, hashes as uint64>]}.
The default engine is vllm (docs/engines.md).`,
		Example: `  kvctl events decode --hex 93cb41da3054981000009181a474797065b0416c6c426c6f636b73436c656172656400
  kvctl events decode --file payload.bin
  kvctl events decode --engine sglang --hex 93cb41da5c17c0000000...
  kvctl events decode --engine trtllm --json "$(curl -s -X POST http://127.0.0.1:8000/kv_cache_events)"`,
		Args: parityNoArgs,
		RunE: runEventsDecode,
	}
	decode.Flags().String("engine", "vllm", "engine that produced the payload: vllm, sglang, trtllm")
	decode.Flags().String("hex", "", "payload as hex (vllm, sglang)")
	decode.Flags().String("json", "", "TensorRT-LLM drain body, the JSON text POST /kv_cache_events returned (trtllm)")
	decode.Flags().String("file", "", "file holding the raw payload bytes, or the drain body for trtllm")
	eventsCmd.AddCommand(decode)
	root.AddCommand(eventsCmd)
}

// eventJSON is one event in kvctl's output; pointers print null when absent.
type eventJSON struct {
	Type            string   `json:"type"`
	BlockHashes     []uint64 `json:"block_hashes"`
	ParentBlockHash *uint64  `json:"parent_block_hash"`
	TokenIDs        []uint32 `json:"token_ids"`
	BlockSize       *int     `json:"block_size"`
	Medium          *string  `json:"medium"`
	LoRAName        *string  `json:"lora_name"`
}

type batchJSON struct {
	TS               *float64    `json:"ts"`
	DataParallelRank *int        `json:"data_parallel_rank"`
	Events           []eventJSON `json:"events"`
}

func runEventsDecode(cmd *cobra.Command, _ []string) error {
	f := cmd.Flags()
	engine, _ := f.GetString("engine")
	hexIn, _ := f.GetString("hex")
	jsonIn, _ := f.GetString("json")
	file, _ := f.GetString("file")
	switch engine {
	case "vllm", "sglang":
		if f.Changed("json") {
			return badInput("--json: only --engine trtllm takes a JSON drain body; %s payloads are msgpack (--hex or --file)", engine)
		}
	case "trtllm":
		if f.Changed("hex") {
			return badInput("--hex: a TensorRT-LLM drain body is JSON; pass it with --json or --file")
		}
		return runEventsDecodeTRTLLM(cmd, jsonIn, file)
	default:
		return badInput("--engine: %q is not an engine; allowed values: vllm, sglang, trtllm", engine)
	}
	var (
		payload []byte
		source  string
	)
	switch hasHex, hasFile := f.Changed("hex"), f.Changed("file"); {
	case hasHex && hasFile:
		return badInput("--hex and --file are mutually exclusive")
	case !hasHex && !hasFile:
		return badInput("--hex or --file is required")
	case hasHex:
		source = "--hex"
		clean := strings.Join(strings.Fields(hexIn), "")
		clean = strings.TrimPrefix(strings.TrimPrefix(clean, "0x"), "0X")
		var err error
		if payload, err = hex.DecodeString(clean); err != nil {
			return badInput("--hex: not valid hex: %v", err)
		}
	default:
		source = "--file"
		var err error
		if payload, err = parityReadFile(file); err != nil {
			return badInput("--file: %v", err)
		}
	}
	if len(payload) == 0 {
		return badInput("%s: empty payload", source)
	}
	if engine == "sglang" {
		return runEventsDecodeSGLang(cmd, payload, source)
	}

	var d kvevents.Decoder
	var b kvevents.Batch
	if err := d.Decode(payload, &b); err != nil {
		return badInput("%s: not a KV-event batch: %v", source, err)
	}
	if skipped := b.UnknownEvents + b.UnknownFields + b.BadEvents + b.BadFields; skipped > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "kvctl: skipped %d unknown event(s), %d unknown field(s), %d malformed event(s), %d malformed field(s)\n",
			b.UnknownEvents, b.UnknownFields, b.BadEvents, b.BadFields)
	}
	return parityPrintJSON(cmd.OutOrStdout(), batchToJSON(&b))
}

func batchToJSON(b *kvevents.Batch) batchJSON {
	out := batchJSON{Events: make([]eventJSON, 0, len(b.Events))}
	if !math.IsNaN(b.TS) && !math.IsInf(b.TS, 0) {
		ts := b.TS
		out.TS = &ts
	}
	if b.HasRank {
		r := b.DataParallelRank
		out.DataParallelRank = &r
	}
	for i := range b.Events {
		e := &b.Events[i]
		ej := eventJSON{
			Type:        e.Type.String(),
			BlockHashes: append([]uint64{}, e.BlockHashes...),
			TokenIDs:    append([]uint32{}, e.TokenIDs...),
		}
		if e.HasParent {
			p := e.ParentBlockHash
			ej.ParentBlockHash = &p
		}
		if e.Type == kvevents.BlockStored && e.HasBlockSize {
			bs := e.BlockSize
			ej.BlockSize = &bs
		}
		if e.Medium != "" || e.HasMedium {
			m := e.Medium
			ej.Medium = &m
		}
		if e.LoRAName != "" || e.HasLoRAName {
			l := e.LoRAName
			ej.LoRAName = &l
		}
		out.Events = append(out.Events, ej)
	}
	return out
}

// sglangEventJSON is one SGLang event in kvctl's output; hashes are signed,
// as SGLang publishes them.
type sglangEventJSON struct {
	Type            string   `json:"type"`
	Shape           string   `json:"shape"`
	BlockHashes     []int64  `json:"block_hashes"`
	ParentBlockHash *int64   `json:"parent_block_hash"`
	TokenIDs        []uint64 `json:"token_ids"`
	BlockSize       *int     `json:"block_size"`
	LoRAID          *int64   `json:"lora_id"`
	Medium          *string  `json:"medium"`
	CacheSalt       *string  `json:"cache_salt"`
	SessionID       *string  `json:"session_id"`
	LoRAName        *string  `json:"lora_name"`
}

type sglangBatchJSON struct {
	Engine     string            `json:"engine"`
	TS         *float64          `json:"ts"`
	AttnDPRank *int              `json:"attn_dp_rank"`
	Events     []sglangEventJSON `json:"events"`
}

func optStr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func runEventsDecodeSGLang(cmd *cobra.Command, payload []byte, source string) error {
	b, err := sglang.Decode(payload)
	if err != nil {
		return badInput("%s: not an SGLang KV-event batch: %v", source, err)
	}
	if skipped := b.UnknownEvents + b.UnknownFields + b.BadEvents + b.UnknownMediums; skipped > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "kvctl: skipped %d unknown event(s), %d unknown field(s), %d malformed event(s); %d unknown medium value(s)\n",
			b.UnknownEvents, b.UnknownFields, b.BadEvents, b.UnknownMediums)
	}
	out := sglangBatchJSON{Engine: "sglang", Events: make([]sglangEventJSON, 0, len(b.Events))}
	if !math.IsNaN(b.TS) && !math.IsInf(b.TS, 0) {
		ts := b.TS
		out.TS = &ts
	}
	if b.HasRank {
		r := b.AttnDPRank
		out.AttnDPRank = &r
	}
	for i := range b.Events {
		e := &b.Events[i]
		ej := sglangEventJSON{Type: e.Type.String(), Shape: e.Shape.String(), BlockHashes: make([]int64, len(e.BlockHashes)),
			TokenIDs: append([]uint64{}, e.TokenIDs...), Medium: optStr(e.Medium), CacheSalt: optStr(e.CacheSalt),
			SessionID: optStr(e.SessionID), LoRAName: optStr(e.LoRAName)}
		for j, h := range e.BlockHashes {
			ej.BlockHashes[j] = int64(h)
		}
		if e.HasParent {
			p := int64(e.ParentBlockHash)
			ej.ParentBlockHash = &p
		}
		if e.Type == sglang.BlockStored {
			bs := e.BlockSize
			ej.BlockSize = &bs
		}
		if e.HasLoRAID {
			l := e.LoRAID
			ej.LoRAID = &l
		}
		out.Events = append(out.Events, ej)
	}
	return parityPrintJSON(cmd.OutOrStdout(), out)
}

type trtllmDrainJSON struct {
	Engine string         `json:"engine"`
	Events []trtllm.Event `json:"events"`
}

func runEventsDecodeTRTLLM(cmd *cobra.Command, jsonIn, file string) error {
	f := cmd.Flags()
	var (
		body   []byte
		source string
	)
	switch hasJSON, hasFile := f.Changed("json"), f.Changed("file"); {
	case hasJSON && hasFile:
		return badInput("--json and --file are mutually exclusive")
	case !hasJSON && !hasFile:
		return badInput("--json or --file is required with --engine trtllm")
	case hasJSON:
		source, body = "--json", []byte(jsonIn)
		if len(body) > parityMaxInput {
			return badInput("--json: larger than %d bytes", parityMaxInput)
		}
	default:
		source = "--file"
		var err error
		if body, err = parityReadFile(file); err != nil {
			return badInput("--file: %v", err)
		}
	}
	evs, err := trtllm.Decode(body)
	if err != nil {
		return badInput("%s: %v", source, err)
	}
	return parityPrintJSON(cmd.OutOrStdout(), trtllmDrainJSON{Engine: "trtllm", Events: evs})
}
