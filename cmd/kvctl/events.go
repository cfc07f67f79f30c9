package main

import (
	"encoding/hex"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/pkg/kvevents"
)

// eventsCmd groups the KV-event tools; later subcommands (watch, replay)
// attach to it.
var eventsCmd = &cobra.Command{
	Use:   "events",
	Short: "Decode and inspect vLLM KV-event payloads",
	Args:  cobra.NoArgs,
}

func init() {
	decode := &cobra.Command{
		Use:   "decode (--hex H | --file F)",
		Short: "Decode one KV-event batch payload (ZMQ frame 3) to JSON",
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
event types are skipped (counted on stderr).`,
		Example: `  kvctl events decode --hex 93cb41da3054981000009181a474797065b0416c6c426c6f636b73436c656172656400
  kvctl events decode --file payload.bin`,
		Args: parityNoArgs,
		RunE: runEventsDecode,
	}
	decode.Flags().String("hex", "", "payload as hex")
	decode.Flags().String("file", "", "file holding the raw payload bytes")
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
	hexIn, _ := f.GetString("hex")
	file, _ := f.GetString("file")
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
