package kvevents

import "fmt"

// AppendEncode appends the msgpack payload of b in the given layout, byte
// for byte what vLLM's msgspec encoder writes for that release:
//
//   - the batch is always an array: [ts (float64), events, data_parallel_rank
//     (int or nil)], or [ts, events] for LayoutArrayV0_9;
//   - LayoutMap events are maps, "type" first, then the declared fields in
//     order; required fields are always written (nil when absent), optional
//     ones (extra_keys, group_idx, kv_cache_spec_*, locality) only when set;
//   - array layouts write [tag, every field the release declared...], nil
//     for absent values;
//   - integers take the shortest msgpack form (unsigned for non-negative
//     values), strings the shortest str head, hashes are ints unless the
//     event carries their bytes (HashBytes / ParentDigest).
//
// Events of type Unknown are an error, as is an unknown layout.
func AppendEncode(dst []byte, b *Batch, layout Layout) ([]byte, error) {
	if layout < LayoutMap || layout > LayoutArrayV0_9 {
		return dst, fmt.Errorf("kvevents: unknown layout %d", int(layout))
	}
	for i := range b.Events {
		if t := b.Events[i].Type; t != BlockStored && t != BlockRemoved && t != AllBlocksCleared {
			return dst, fmt.Errorf("kvevents: event %d has unknown type %d", i, int(t))
		}
	}
	if layout == LayoutArrayV0_9 {
		dst = appendArrayHead(dst, 2)
	} else {
		dst = appendArrayHead(dst, 3)
	}
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayHead(dst, len(b.Events))
	for i := range b.Events {
		if layout == LayoutMap {
			dst = appendMapEvent(dst, &b.Events[i])
		} else {
			dst = appendArrayEvent(dst, &b.Events[i], layout)
		}
	}
	if layout != LayoutArrayV0_9 {
		if b.HasRank {
			dst = appendInt(dst, int64(b.DataParallelRank))
		} else {
			dst = appendNil(dst)
		}
	}
	return dst, nil
}

func appendHashes(dst []byte, e *Event) []byte {
	dst = appendArrayHead(dst, len(e.BlockHashes))
	useBytes := e.HashBytesLen > 0 && len(e.HashBytes) == e.HashBytesLen*len(e.BlockHashes)
	for i, h := range e.BlockHashes {
		if useBytes {
			dst = appendBin(dst, e.HashBytes[i*e.HashBytesLen:(i+1)*e.HashBytesLen])
		} else {
			dst = appendUint(dst, h)
		}
	}
	return dst
}

func appendParent(dst []byte, e *Event) []byte {
	switch {
	case len(e.ParentDigest) > 0:
		return appendBin(dst, e.ParentDigest)
	case e.HasParent:
		return appendUint(dst, e.ParentBlockHash)
	}
	return appendNil(dst)
}

func appendTokens(dst []byte, e *Event) []byte {
	dst = appendArrayHead(dst, len(e.TokenIDs))
	for _, t := range e.TokenIDs {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

// appendStrOrNil writes s, or nil when s is "" and was not present as an
// empty string (Event.HasMedium / HasLoRAName from the decoder).
func appendStrOrNil(dst []byte, s string, present bool) []byte {
	if s == "" && !present {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}

func appendOptInt(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return appendNil(dst)
	}
	return appendInt(dst, v)
}

func appendExtraKeys(dst []byte, e *Event) []byte {
	if len(e.ExtraKeys) == 0 {
		return appendNil(dst)
	}
	return append(dst, e.ExtraKeys...)
}

func appendMapEvent(dst []byte, e *Event) []byte {
	switch e.Type {
	case BlockStored:
		n := 8 // type + 7 required fields
		for _, set := range []bool{len(e.ExtraKeys) > 0, e.HasGroupIdx, e.KVCacheSpecKind != "", e.HasSlidingWindow, e.Locality != ""} {
			if set {
				n++
			}
		}
		dst = appendMapHead(dst, n)
		dst = appendStr(appendStr(dst, keyType), tagBlockStored)
		dst = appendHashes(appendStr(dst, keyBlockHashes), e)
		dst = appendParent(appendStr(dst, keyParent), e)
		dst = appendTokens(appendStr(dst, keyTokenIDs), e)
		dst = appendInt(appendStr(dst, keyBlockSize), int64(e.BlockSize))
		dst = appendOptInt(appendStr(dst, keyLoRAID), e.LoRAID, e.HasLoRAID)
		dst = appendStrOrNil(appendStr(dst, keyMedium), e.Medium, e.HasMedium)
		dst = appendStrOrNil(appendStr(dst, keyLoRAName), e.LoRAName, e.HasLoRAName)
		if len(e.ExtraKeys) > 0 {
			dst = appendExtraKeys(appendStr(dst, keyExtraKeys), e)
		}
		if e.HasGroupIdx {
			dst = appendInt(appendStr(dst, keyGroupIdx), e.GroupIdx)
		}
		if e.KVCacheSpecKind != "" {
			dst = appendStr(appendStr(dst, keySpecKind), e.KVCacheSpecKind)
		}
		if e.HasSlidingWindow {
			dst = appendInt(appendStr(dst, keySlidingWindow), e.SlidingWindow)
		}
		if e.Locality != "" {
			dst = appendStr(appendStr(dst, keyLocality), e.Locality)
		}
	case BlockRemoved:
		n := 3 // type, block_hashes, medium
		if e.HasGroupIdx {
			n++
		}
		if e.Locality != "" {
			n++
		}
		dst = appendMapHead(dst, n)
		dst = appendStr(appendStr(dst, keyType), tagBlockRemoved)
		dst = appendHashes(appendStr(dst, keyBlockHashes), e)
		dst = appendStrOrNil(appendStr(dst, keyMedium), e.Medium, e.HasMedium)
		if e.HasGroupIdx {
			dst = appendInt(appendStr(dst, keyGroupIdx), e.GroupIdx)
		}
		if e.Locality != "" {
			dst = appendStr(appendStr(dst, keyLocality), e.Locality)
		}
	default:
		dst = appendMapHead(dst, 1)
		dst = appendStr(appendStr(dst, keyType), tagAllBlocksClear)
	}
	return dst
}

func appendArrayEvent(dst []byte, e *Event, layout Layout) []byte {
	n := layout.arrayFields(e.Type)
	dst = appendArrayHead(dst, 1+n)
	dst = appendStr(dst, e.Type.String())
	for pos := 1; pos <= n; pos++ {
		if e.Type == BlockStored {
			dst = appendStoredField(dst, e, pos)
		} else {
			dst = appendRemovedField(dst, e, pos)
		}
	}
	return dst
}

func appendStoredField(dst []byte, e *Event, pos int) []byte {
	switch pos {
	case 1:
		return appendHashes(dst, e)
	case 2:
		return appendParent(dst, e)
	case 3:
		return appendTokens(dst, e)
	case 4:
		return appendInt(dst, int64(e.BlockSize))
	case 5:
		return appendOptInt(dst, e.LoRAID, e.HasLoRAID)
	case 6:
		return appendStrOrNil(dst, e.Medium, e.HasMedium)
	case 7:
		return appendStrOrNil(dst, e.LoRAName, e.HasLoRAName)
	case 8:
		return appendExtraKeys(dst, e)
	case 9:
		return appendOptInt(dst, e.GroupIdx, e.HasGroupIdx)
	case 10:
		return appendOptStr(dst, e.KVCacheSpecKind)
	default:
		return appendOptInt(dst, e.SlidingWindow, e.HasSlidingWindow)
	}
}

func appendRemovedField(dst []byte, e *Event, pos int) []byte {
	switch pos {
	case 1:
		return appendHashes(dst, e)
	case 2:
		return appendStrOrNil(dst, e.Medium, e.HasMedium)
	default:
		return appendOptInt(dst, e.GroupIdx, e.HasGroupIdx)
	}
}

// AppendExtraKeys appends the msgpack of the extra_keys field vLLM puts in a
// BlockStored event covering n blocks that start at block index first: per
// block nil, or the block's extra keys (LoRA name on every block, cache_salt
// on block 0 only). Use it for Event.ExtraKeys to publish what vLLM publishes.
func AppendExtraKeys(dst []byte, first, n int, loraName, cacheSalt string) []byte {
	dst = appendArrayHead(dst, n)
	for i := first; i < first+n; i++ {
		salt := ""
		if i == 0 {
			salt = cacheSalt
		}
		k := 0
		if loraName != "" {
			k++
		}
		if salt != "" {
			k++
		}
		if k == 0 {
			dst = appendNil(dst)
			continue
		}
		dst = appendArrayHead(dst, k)
		if loraName != "" {
			dst = appendStr(dst, loraName)
		}
		if salt != "" {
			dst = appendStr(dst, salt)
		}
	}
	return dst
}
