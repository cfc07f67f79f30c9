package kvevents

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
)

// DecodeStats are cumulative decode counters, for the subscriber's metrics.
type DecodeStats struct {
	Batches       uint64 // payloads decoded successfully
	Errors        uint64 // payloads rejected as malformed
	Events        uint64 // events decoded into batches
	UnknownEvents uint64 // events with an unknown tag or shape, skipped
	UnknownFields uint64 // unknown map keys / extra array positions, skipped
	BadEvents     uint64 // events with a malformed required field, skipped
	BadFields     uint64 // malformed optional fields, dropped (event kept)
}

// maxInterned bounds the decoder's string intern table (media, LoRA names,
// cache spec kinds): beyond it new strings are allocated per event instead.
const maxInterned = 1024

// maxInternLen is the longest string the decoder interns.
const maxInternLen = 256

// Decoder decodes EventBatch payloads. The zero value is ready to use. A
// Decoder is not safe for concurrent use; use one per subscription.
type Decoder struct {
	// Stats accumulate over every Decode call.
	Stats DecodeStats

	interned map[string]string
}

// Decode decodes one msgpack EventBatch payload (ZMQ frame 3) into b,
// reusing b's slices: in steady state it does not allocate.
//
// Accepted: the outer [ts, events, data_parallel_rank] array and the older
// [ts, events] form (a map-shaped batch too); events as maps (vLLM >= 0.26)
// or positional arrays (older releases); block hashes as any msgpack integer
// (signed ones keep their 64 bits) or as bytes (trailing 8 bytes).
// Unknown fields and unknown event types are skipped and counted. A
// structurally broken payload returns a *DecodeError and leaves b empty.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	*b = Batch{Events: b.Events[:0]}
	r := reader{b: payload}
	err := d.decodeBatch(&r, b)
	if err == nil && r.remaining() != 0 {
		err = r.fail("trailing bytes after the batch")
	}
	if err != nil {
		*b = Batch{Events: b.Events[:0]}
		d.Stats.Errors++
		return err
	}
	d.Stats.Batches++
	d.Stats.Events += uint64(len(b.Events))
	d.Stats.UnknownEvents += uint64(b.UnknownEvents)
	d.Stats.UnknownFields += uint64(b.UnknownFields)
	d.Stats.BadEvents += uint64(b.BadEvents)
	d.Stats.BadFields += uint64(b.BadFields)
	return nil
}

func (d *Decoder) decodeBatch(r *reader, b *Batch) error {
	switch r.kind() {
	case kindArray:
	case kindMap:
		return d.decodeMapBatch(r, b)
	default:
		return r.fail("event batch is not an array")
	}
	n, err := r.readArrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.fail("event batch has fewer than 2 elements")
	}
	if b.TS, err = r.readFloat(); err != nil {
		return err
	}
	if err := d.decodeEvents(r, b); err != nil {
		return err
	}
	if n == 2 {
		b.Legacy = true
		return nil
	}
	if err := d.decodeRank(r, b); err != nil {
		return err
	}
	for i := 3; i < n; i++ {
		b.UnknownFields++
		if err := r.skip(); err != nil {
			return err
		}
	}
	return nil
}

// decodeMapBatch handles an EventBatch encoded as a map (seen on one
// pre-release branch of vLLM; the released encoder keeps the array).
func (d *Decoder) decodeMapBatch(r *reader, b *Batch) error {
	n, err := r.readMapLen()
	if err != nil {
		return err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		key, err := r.readBytes()
		if err != nil {
			return err
		}
		switch string(key) {
		case keyBatchTS:
			if b.TS, err = r.readFloat(); err != nil {
				return err
			}
		case keyBatchEvents:
			sawEvents = true
			if err := d.decodeEvents(r, b); err != nil {
				return err
			}
		case keyBatchRank:
			if err := d.decodeRank(r, b); err != nil {
				return err
			}
		default:
			b.UnknownFields++
			if err := r.skip(); err != nil {
				return err
			}
		}
	}
	if !sawEvents {
		return r.fail("event batch map has no events")
	}
	return nil
}

// decodeRank reads data_parallel_rank. A rank that is not an integer in
// 0..MaxInt32 is dropped and counted (the batch reads as rank-less, like a
// nil rank): the batch's events still apply.
func (d *Decoder) decodeRank(r *reader, b *Batch) error {
	if r.readNil() {
		return nil
	}
	if r.kind() != kindInt {
		b.BadFields++
		return r.skip()
	}
	bits, neg, err := r.readInt()
	if err != nil {
		return err
	}
	if neg || bits > math.MaxInt32 {
		b.BadFields++
		return nil
	}
	b.DataParallelRank, b.HasRank = int(bits), true
	return nil
}

func (d *Decoder) decodeEvents(r *reader, b *Batch) error {
	n, err := r.readArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		e := b.next()
		start := r.off
		var ok bool
		switch r.kind() {
		case kindMap:
			ok, err = d.decodeMapEvent(r, b, e)
		case kindArray:
			ok, err = d.decodeArrayEvent(r, b, e)
		default:
			err = r.skip()
		}
		if err != nil {
			var de *DecodeError
			if errors.As(err, &de) && r.off > start {
				// A malformed known field inside an event: skip the whole
				// event if its extent can still be found, else give up.
				r.off = start
				if r.skip() == nil {
					b.BadEvents++
					b.Events = b.Events[:len(b.Events)-1]
					continue
				}
			}
			return err
		}
		if !ok || e.Type == Unknown {
			b.UnknownEvents++
			b.Events = b.Events[:len(b.Events)-1]
		}
	}
	return nil
}

// next appends a reset event to b, reusing a previous event's slices.
func (b *Batch) next() *Event {
	if len(b.Events) < cap(b.Events) {
		b.Events = b.Events[:len(b.Events)+1]
	} else {
		b.Events = append(b.Events, Event{})
	}
	e := &b.Events[len(b.Events)-1]
	e.reset()
	return e
}

func eventTypeOf(tag []byte) EventType {
	switch string(tag) {
	case tagBlockStored:
		return BlockStored
	case tagBlockRemoved:
		return BlockRemoved
	case tagAllBlocksClear:
		return AllBlocksCleared
	}
	return Unknown
}

// decodeMapEvent decodes {"type": tag, field: value, ...}; keys may come in
// any order. ok is false when the event has no usable tag.
func (d *Decoder) decodeMapEvent(r *reader, b *Batch, e *Event) (ok bool, err error) {
	n, err := r.readMapLen()
	if err != nil {
		return false, err
	}
	sawHashes := false
	for i := 0; i < n; i++ {
		if r.kind() != kindStr {
			return false, r.fail("event map key is not a string")
		}
		key, err := r.readBytes()
		if err != nil {
			return false, err
		}
		switch string(key) {
		case keyType:
			if r.kind() != kindStr {
				return false, r.fail("event type is not a string")
			}
			tag, err := r.readBytes()
			if err != nil {
				return false, err
			}
			e.Type = eventTypeOf(tag)
		case keyBlockHashes:
			sawHashes = true
			err = d.decodeHashes(r, e)
		case keyParent:
			err = d.decodeParent(r, e)
		case keyTokenIDs:
			err = d.decodeTokens(r, b, e)
		case keyBlockSize:
			err = d.decodeBlockSize(r, b, e)
		case keyLoRAID:
			e.LoRAID, e.HasLoRAID, err = d.optInt(r, b)
		case keyMedium:
			e.Medium, e.HasMedium, err = d.optStr(r, b)
		case keyLoRAName:
			e.LoRAName, e.HasLoRAName, err = d.optStr(r, b)
		case keyExtraKeys:
			err = d.decodeExtraKeys(r, e)
		case keyGroupIdx:
			e.GroupIdx, e.HasGroupIdx, err = d.optInt(r, b)
		case keySpecKind:
			e.KVCacheSpecKind, _, err = d.optStr(r, b)
		case keySlidingWindow:
			e.SlidingWindow, e.HasSlidingWindow, err = d.optInt(r, b)
		case keyLocality:
			e.Locality, _, err = d.optStr(r, b)
		default:
			b.UnknownFields++
			err = r.skip()
		}
		if err != nil {
			return false, err
		}
	}
	if (e.Type == BlockStored || e.Type == BlockRemoved) && !sawHashes {
		return false, r.fail("event has no block_hashes")
	}
	return true, nil
}

// decodeArrayEvent decodes [tag, f1, f2, ...]; positions keep their meaning
// across vLLM releases because fields were only ever appended.
func (d *Decoder) decodeArrayEvent(r *reader, b *Batch, e *Event) (ok bool, err error) {
	n, err := r.readArrayLen()
	if err != nil {
		return false, err
	}
	if n == 0 || r.kind() != kindStr {
		for i := 0; i < n; i++ {
			if err := r.skip(); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	tag, err := r.readBytes()
	if err != nil {
		return false, err
	}
	e.Type = eventTypeOf(tag)
	if (e.Type == BlockStored || e.Type == BlockRemoved) && n < 2 {
		return false, r.fail("event has no block_hashes")
	}
	for pos := 1; pos < n; pos++ {
		switch {
		case e.Type == BlockStored:
			err = d.storedField(r, b, e, pos)
		case e.Type == BlockRemoved:
			err = d.removedField(r, b, e, pos)
		case e.Type == AllBlocksCleared:
			b.UnknownFields++
			err = r.skip()
		default:
			err = r.skip()
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

func (d *Decoder) storedField(r *reader, b *Batch, e *Event, pos int) (err error) {
	switch pos {
	case 1:
		return d.decodeHashes(r, e)
	case 2:
		return d.decodeParent(r, e)
	case 3:
		return d.decodeTokens(r, b, e)
	case 4:
		return d.decodeBlockSize(r, b, e)
	case 5:
		e.LoRAID, e.HasLoRAID, err = d.optInt(r, b)
	case 6:
		e.Medium, e.HasMedium, err = d.optStr(r, b)
	case 7:
		e.LoRAName, e.HasLoRAName, err = d.optStr(r, b)
	case 8:
		return d.decodeExtraKeys(r, e)
	case 9:
		e.GroupIdx, e.HasGroupIdx, err = d.optInt(r, b)
	case 10:
		e.KVCacheSpecKind, _, err = d.optStr(r, b)
	case 11:
		e.SlidingWindow, e.HasSlidingWindow, err = d.optInt(r, b)
	default:
		b.UnknownFields++
		return r.skip()
	}
	return err
}

func (d *Decoder) removedField(r *reader, b *Batch, e *Event, pos int) (err error) {
	switch pos {
	case 1:
		return d.decodeHashes(r, e)
	case 2:
		e.Medium, e.HasMedium, err = d.optStr(r, b)
	case 3:
		e.GroupIdx, e.HasGroupIdx, err = d.optInt(r, b)
	default:
		b.UnknownFields++
		return r.skip()
	}
	return err
}

// hashValue reads one block hash: an integer of any width (64 bits kept)
// or bytes (trailing 8 bytes, big-endian). raw is the bytes form, if any.
func hashValue(r *reader) (v uint64, raw []byte, err error) {
	switch r.kind() {
	case kindInt:
		v, _, err = r.readInt()
		return v, nil, err
	case kindBin:
		raw, err = r.readBytes()
		if err != nil {
			return 0, nil, err
		}
		if len(raw) >= 8 {
			return binary.BigEndian.Uint64(raw[len(raw)-8:]), raw, nil
		}
		for _, c := range raw {
			v = v<<8 | uint64(c)
		}
		return v, raw, nil
	}
	return 0, nil, r.fail("block hash is neither an integer nor bytes")
}

func (d *Decoder) decodeHashes(r *reader, e *Event) error {
	n, err := r.readArrayLen()
	if err != nil {
		return err
	}
	e.BlockHashes = e.BlockHashes[:0]
	e.HashBytes = e.HashBytes[:0]
	e.HashBytesLen = 0
	allBytes := true
	for i := 0; i < n; i++ {
		v, raw, err := hashValue(r)
		if err != nil {
			return err
		}
		e.BlockHashes = append(e.BlockHashes, v)
		switch {
		case raw == nil || !allBytes:
			allBytes = false
		case i == 0:
			e.HashBytesLen = len(raw)
			e.HashBytes = append(e.HashBytes, raw...)
		case len(raw) == e.HashBytesLen:
			e.HashBytes = append(e.HashBytes, raw...)
		default:
			allBytes = false
		}
	}
	if !allBytes || n == 0 {
		e.HashBytes = e.HashBytes[:0]
		e.HashBytesLen = 0
	}
	return nil
}

func (d *Decoder) decodeParent(r *reader, e *Event) error {
	e.HasParent = false
	e.ParentDigest = e.ParentDigest[:0]
	if r.readNil() {
		return nil
	}
	v, raw, err := hashValue(r)
	if err != nil {
		return err
	}
	e.ParentBlockHash, e.HasParent = v, true
	if raw != nil {
		e.ParentDigest = append(e.ParentDigest, raw...)
	}
	return nil
}

// decodeTokens keeps token_ids when every element is an integer in uint32
// range; otherwise the field is dropped (counted) and the event still applies.
func (d *Decoder) decodeTokens(r *reader, b *Batch, e *Event) error {
	e.TokenIDs = e.TokenIDs[:0]
	if r.readNil() {
		return nil
	}
	if r.kind() != kindArray {
		b.BadFields++
		return r.skip()
	}
	n, err := r.readArrayLen()
	if err != nil {
		return err
	}
	e.TokenIDs = slices.Grow(e.TokenIDs, n) // n <= bytes left, so bounded by the payload
	bad := false
	for i := 0; i < n; i++ {
		// Fast path for the forms msgspec writes for token ids.
		if !bad && r.off < len(r.b) {
			p := r.b[r.off:]
			switch c := p[0]; {
			case c <= 0x7f:
				e.TokenIDs = append(e.TokenIDs, uint32(c))
				r.off++
				continue
			case c == 0xcd && len(p) >= 3:
				e.TokenIDs = append(e.TokenIDs, uint32(binary.BigEndian.Uint16(p[1:3])))
				r.off += 3
				continue
			case c == 0xce && len(p) >= 5:
				e.TokenIDs = append(e.TokenIDs, binary.BigEndian.Uint32(p[1:5]))
				r.off += 5
				continue
			case c == 0xcc && len(p) >= 2:
				e.TokenIDs = append(e.TokenIDs, uint32(p[1]))
				r.off += 2
				continue
			}
		}
		if bad || r.kind() != kindInt {
			bad = true
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		v, neg, err := r.readInt()
		if err != nil {
			return err
		}
		if neg || v > math.MaxUint32 {
			bad = true
			continue
		}
		e.TokenIDs = append(e.TokenIDs, uint32(v))
	}
	if bad {
		b.BadFields++
		e.TokenIDs = e.TokenIDs[:0]
	}
	return nil
}

func (d *Decoder) decodeBlockSize(r *reader, b *Batch, e *Event) error {
	v, ok, err := d.optInt(r, b)
	if err != nil {
		return err
	}
	if ok && (v < 0 || v > math.MaxUint32) {
		b.BadFields++
		v, ok = 0, false
	}
	e.BlockSize, e.HasBlockSize = int(v), ok
	return nil
}

// decodeExtraKeys keeps the raw msgpack of extra_keys (nil = absent).
func (d *Decoder) decodeExtraKeys(r *reader, e *Event) error {
	e.ExtraKeys = e.ExtraKeys[:0]
	if r.readNil() {
		return nil
	}
	start := r.off
	if err := r.skip(); err != nil {
		return err
	}
	e.ExtraKeys = append(e.ExtraKeys, r.b[start:r.off]...)
	return nil
}

// optInt reads an optional integer field: nil gives ok=false; a value of
// another type or out of int64 range is dropped and counted.
func (d *Decoder) optInt(r *reader, b *Batch) (v int64, ok bool, err error) {
	if r.readNil() {
		return 0, false, nil
	}
	if r.kind() != kindInt {
		b.BadFields++
		return 0, false, r.skip()
	}
	bits, neg, err := r.readInt()
	if err != nil {
		return 0, false, err
	}
	if !neg && bits > math.MaxInt64 {
		b.BadFields++
		return 0, false, nil
	}
	return int64(bits), true, nil
}

// optStr reads an optional string field: nil gives ("", false); a value of
// another type is dropped and counted. ok tells a present "" from nil.
func (d *Decoder) optStr(r *reader, b *Batch) (s string, ok bool, err error) {
	if r.readNil() {
		return "", false, nil
	}
	if r.kind() != kindStr {
		b.BadFields++
		return "", false, r.skip()
	}
	p, err := r.readBytes()
	if err != nil {
		return "", false, err
	}
	return d.intern(p), true, nil
}

// intern returns a string equal to p without allocating for values seen
// before (the few media, cache-spec kinds and LoRA names a fleet uses).
func (d *Decoder) intern(p []byte) string {
	switch string(p) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "STORAGE":
		return "STORAGE"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "LOCAL":
		return "LOCAL"
	case "REMOTE":
		return "REMOTE"
	}
	if s, ok := d.interned[string(p)]; ok {
		return s
	}
	s := string(p)
	if len(p) <= maxInternLen && len(d.interned) < maxInterned {
		if d.interned == nil {
			d.interned = make(map[string]string)
		}
		d.interned[s] = s
	}
	return s
}
