package sglang

import (
	"encoding/binary"
	"fmt"
	"math"
)

// AppendEncode appends the payload SGLang's publisher sends for b, in shape:
// ShapeMap (tagged maps, SGLang after it dropped array_like; "type" first,
// medium/cache_salt/session_id/lora_name left out when empty) or ShapeArray
// (the legacy tagged arrays with medium, every field written). The batch is
// [ts, events, attn_dp_rank], the rank nil unless HasRank. Integers take
// their shortest msgpack form and hashes are written signed, as msgspec
// writes SGLang's int64 values (docs/engines.md, "SGLang events"). The
// simulator publishes with it; golden vectors pin it byte for byte.
func AppendEncode(dst []byte, b *Batch, shape Shape) ([]byte, error) {
	if shape != ShapeMap && shape != ShapeArray {
		return dst, fmt.Errorf("sglang encode: unknown shape %d", shape)
	}
	dst = appendArrayHead(dst, 3)
	dst = binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(b.TS))
	dst = appendArrayHead(dst, len(b.Events))
	for i := range b.Events {
		e := &b.Events[i]
		var err error
		if shape == ShapeMap {
			dst, err = appendMapEvent(dst, e)
		} else {
			dst, err = appendArrayEvent(dst, e)
		}
		if err != nil {
			return dst, fmt.Errorf("sglang encode: event %d: %w", i, err)
		}
	}
	if b.HasRank {
		dst = appendInt(dst, int64(b.AttnDPRank))
	} else {
		dst = append(dst, 0xc0)
	}
	return dst, nil
}

func appendMapEvent(dst []byte, e *Event) ([]byte, error) {
	switch e.Type {
	case BlockStored:
		n := 6
		for _, s := range []string{e.Medium, e.CacheSalt, e.SessionID, e.LoRAName} {
			if s != "" {
				n++
			}
		}
		dst = appendMapHead(dst, n)
		dst = appendStr(appendStr(dst, "type"), "BlockStored")
		dst = appendHashList(appendStr(dst, "block_hashes"), e.BlockHashes)
		dst = appendParentHash(appendStr(dst, "parent_block_hash"), e)
		dst = appendTokenList(appendStr(dst, "token_ids"), e.TokenIDs)
		dst = appendInt(appendStr(dst, "block_size"), int64(e.BlockSize))
		dst = appendLoRAID(appendStr(dst, "lora_id"), e)
		for _, kv := range [][2]string{{"medium", e.Medium}, {"cache_salt", e.CacheSalt}, {"session_id", e.SessionID}, {"lora_name", e.LoRAName}} {
			if kv[1] != "" {
				dst = appendStr(appendStr(dst, kv[0]), kv[1])
			}
		}
	case BlockRemoved:
		n := 2
		if e.Medium != "" {
			n++
		}
		dst = appendMapHead(dst, n)
		dst = appendStr(appendStr(dst, "type"), "BlockRemoved")
		dst = appendHashList(appendStr(dst, "block_hashes"), e.BlockHashes)
		if e.Medium != "" {
			dst = appendStr(appendStr(dst, "medium"), e.Medium)
		}
	case AllBlocksCleared:
		dst = appendStr(appendStr(appendMapHead(dst, 1), "type"), "AllBlocksCleared")
	default:
		return dst, fmt.Errorf("unknown event type %d", e.Type)
	}
	return dst, nil
}

// appendArrayEvent writes the legacy array_like events of the releases with
// medium: msgspec writes every field, nil for an unset medium. The
// metadata variant (BlockStoredWithMetadata) is not written.
func appendArrayEvent(dst []byte, e *Event) ([]byte, error) {
	optStr := func(dst []byte, s string) []byte {
		if s == "" {
			return append(dst, 0xc0)
		}
		return appendStr(dst, s)
	}
	switch e.Type {
	case BlockStored:
		if e.CacheSalt != "" || e.SessionID != "" || e.LoRAName != "" {
			return dst, fmt.Errorf("the array shape carries no cache_salt, session_id or lora_name; use the map shape")
		}
		dst = appendStr(appendArrayHead(dst, 7), "BlockStored")
		dst = appendHashList(dst, e.BlockHashes)
		dst = appendParentHash(dst, e)
		dst = appendTokenList(dst, e.TokenIDs)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendLoRAID(dst, e)
		dst = optStr(dst, e.Medium)
	case BlockRemoved:
		dst = appendStr(appendArrayHead(dst, 3), "BlockRemoved")
		dst = appendHashList(dst, e.BlockHashes)
		dst = optStr(dst, e.Medium)
	case AllBlocksCleared:
		dst = appendStr(appendArrayHead(dst, 1), "AllBlocksCleared")
	default:
		return dst, fmt.Errorf("unknown event type %d", e.Type)
	}
	return dst, nil
}

func appendHashList(dst []byte, hs []uint64) []byte {
	dst = appendArrayHead(dst, len(hs))
	for _, h := range hs {
		dst = appendInt(dst, int64(h)) // SGLang's hashes are int64
	}
	return dst
}

func appendTokenList(dst []byte, ts []uint64) []byte {
	dst = appendArrayHead(dst, len(ts))
	for _, t := range ts {
		dst = appendInt(dst, int64(t))
	}
	return dst
}

func appendParentHash(dst []byte, e *Event) []byte {
	if !e.HasParent {
		return append(dst, 0xc0)
	}
	return appendInt(dst, int64(e.ParentBlockHash))
}

func appendLoRAID(dst []byte, e *Event) []byte {
	if !e.HasLoRAID {
		return append(dst, 0xc0)
	}
	return appendInt(dst, e.LoRAID)
}

func appendArrayHead(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapHead(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= 0xff:
		dst = append(dst, 0xd9, byte(n))
	case n <= 0xffff:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

// appendInt writes v in its shortest form: unsigned families for v ≥ 0,
// signed ones below, as msgspec does.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		u := uint64(v)
		switch {
		case u <= 0x7f:
			return append(dst, byte(u))
		case u <= 0xff:
			return append(dst, 0xcc, byte(u))
		case u <= 0xffff:
			return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(u))
		case u <= 0xffffffff:
			return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(u))
		}
		return binary.BigEndian.AppendUint64(append(dst, 0xcf), u)
	}
	switch {
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}
