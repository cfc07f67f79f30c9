package kvhash

import "encoding/binary"

// Hand-written canonical CBOR (RFC 8949 §4.2.1, as cbor2.dumps(canonical=True)
// writes it) for exactly the values vLLM hashes: the block tuple
// (parent bytes, tuple of token ids, extra keys tuple or None) and the seed
// string. Proven byte-equal to fxamacker/cbor's canonical mode in tests.

const (
	cborMajorUint  = 0 << 5
	cborMajorBytes = 2 << 5
	cborMajorText  = 3 << 5
	cborMajorArray = 4 << 5
	cborNull       = 0xf6
)

// appendCBORHead appends a major-type head with the shortest argument encoding.
func appendCBORHead(dst []byte, major byte, n uint64) []byte {
	switch {
	case n < 24:
		return append(dst, major|byte(n))
	case n <= 0xff:
		return append(dst, major|24, byte(n))
	case n <= 0xffff:
		return append(dst, major|25, byte(n>>8), byte(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, major|26), uint32(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, major|27), n)
	}
}

func appendCBORText(dst []byte, s string) []byte {
	dst = appendCBORHead(dst, cborMajorText, uint64(len(s)))
	return append(dst, s...)
}

// appendCBORBlock appends CBOR of (parent, tuple(tokens), extra_keys) where
// extra_keys is None unless lora or salt is non-empty, then the tuple of the
// non-empty ones in vLLM's order (LoRA name, cache_salt).
func appendCBORBlock(dst, parent []byte, tokens []uint32, lora, salt string) []byte {
	dst = append(dst, cborMajorArray|3)
	dst = appendCBORHead(dst, cborMajorBytes, uint64(len(parent)))
	dst = append(dst, parent...)
	dst = appendCBORHead(dst, cborMajorArray, uint64(len(tokens)))
	for _, t := range tokens {
		switch {
		case t < 24:
			dst = append(dst, byte(t))
		case t <= 0xff:
			dst = append(dst, 24, byte(t))
		case t <= 0xffff:
			dst = append(dst, 25, byte(t>>8), byte(t))
		default:
			dst = append(dst, 26, byte(t>>24), byte(t>>16), byte(t>>8), byte(t))
		}
	}
	return appendCBORExtra(dst, lora, salt)
}

func appendCBORExtra(dst []byte, lora, salt string) []byte {
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		return append(dst, cborNull)
	}
	dst = append(dst, cborMajorArray|byte(n))
	if lora != "" {
		dst = appendCBORText(dst, lora)
	}
	if salt != "" {
		dst = appendCBORText(dst, salt)
	}
	return dst
}
