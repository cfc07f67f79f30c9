package kvhash

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
)

// SGLang's page hash (docs/engines.md, "SGLang page hashes"): page 0 is
// SHA-256 over the little-endian u32 token ids, with no parent and no seed;
// page i is SHA-256 over page i-1's raw 32-byte digest followed by its
// tokens. A cache_salt makes a 32-byte prior the parent of page 0. The
// published value is the digest's first 8 bytes, big-endian, as a signed
// int64; a LoRA adapter re-hashes every published value under its name.

// Domain separators SGLang hashes in front of the salt and the LoRA name.
const (
	sglangSaltDomain = "sglang-cache-salt-v1\x00"
	sglangLoRADomain = "sglang-kv-event-lora-v1\x00"
)

// sglangWideTag is the byte SGLang's native hasher puts before a page that
// holds a token id above uint32: such a page is hashed as 8-byte
// little-endian words, and the odd byte count keeps it apart from u32 pages.
const sglangWideTag = 0xff

// SGLangSaltPrior returns the parent digest of page 0 for a cache_salt
// (SHA-256 of the domain separator and the salt's UTF-8 bytes), or nil for
// no salt. SGLang treats an empty salt as absent.
func SGLangSaltPrior(salt string) []byte {
	if salt == "" {
		return nil
	}
	h := sha256.New()
	h.Write([]byte(sglangSaltDomain))
	h.Write([]byte(salt))
	return h.Sum(nil)
}

// SGLangWire is the value SGLang publishes for a page digest: its first 8
// bytes, big-endian, read as a signed int64 (returned here as the same 64-bit
// pattern in a uint64, the way kvgate's inventory stores every hash).
func SGLangWire(digest []byte) uint64 {
	return binary.BigEndian.Uint64(digest[:8])
}

// sglangLoRA is the LoRA namespace: a published hash h becomes the first 8
// bytes of SHA-256(seed || h as 8 big-endian bytes), seed being SHA-256 of
// the domain separator and the adapter name.
type sglangLoRA struct{ seed [32]byte }

func newSGLangLoRA(name string) *sglangLoRA {
	if name == "" {
		return nil
	}
	h := sha256.New()
	h.Write([]byte(sglangLoRADomain))
	h.Write([]byte(name))
	var l sglangLoRA
	h.Sum(l.seed[:0])
	return &l
}

func (l *sglangLoRA) apply(wire uint64) uint64 {
	if l == nil {
		return wire
	}
	var in [40]byte
	copy(in[:32], l.seed[:])
	binary.BigEndian.PutUint64(in[32:], wire)
	d := sha256.Sum256(in[:])
	return binary.BigEndian.Uint64(d[:8])
}

// SGLangNamespace applies the LoRA namespace of adapter name to a raw
// published hash (name "" leaves it unchanged). SGLang applies it to every
// block hash and to parent_block_hash alike.
func SGLangNamespace(name string, wire uint64) uint64 { return newSGLangLoRA(name).apply(wire) }

// appendSGLangInput appends the bytes SGLang hashes for one u32 page.
func appendSGLangInput(dst, parent []byte, tokens []uint32) []byte {
	dst = append(dst, parent...)
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// TokenRangeError reports a token id the algorithm cannot hash.
type TokenRangeError struct {
	Algo  Algo
	Index int
	Token uint64
	Max   uint64
}

func (e *TokenRangeError) Error() string {
	return fmt.Sprintf("kvhash: %s: token %d (%d) is above %d", string(e.Algo), e.Index, e.Token, e.Max)
}

// sglangWidePage hashes one page of 64-bit token ids as SGLang's native
// hasher does: u32 words when every id fits, else the wide tag and u64 words.
func sglangWidePage(h hash.Hash, d *[maxDigestLen]byte, parent []byte, tokens []uint64) []byte {
	h.Reset()
	h.Write(parent)
	wide := false
	for _, t := range tokens {
		if t > math.MaxUint32 {
			wide = true
			break
		}
	}
	var w [8]byte
	if wide {
		h.Write([]byte{sglangWideTag})
		for _, t := range tokens {
			binary.LittleEndian.PutUint64(w[:], t)
			h.Write(w[:])
		}
	} else {
		for _, t := range tokens {
			binary.LittleEndian.PutUint32(w[:4], uint32(t))
			h.Write(w[:4])
		}
	}
	return h.Sum(d[:0])
}
