package inventory

// Block hashes from the wire are already uniform for vLLM (SHA-256 or XXH3
// output), but tests, other engines and attackers can send anything: small
// integers would all land in shard 0, slot 0. The table therefore stores a
// bijective mix of each hash (murmur3's fmix64), so placement is uniform for
// any input and the original value is recovered exactly for snapshots.

const (
	mixC1    = 0xff51afd7ed558ccd
	mixC2    = 0xc4ceb9fe1a85ec53
	mixC1Inv = 0x4f74430c22a54005 // mixC1 * mixC1Inv == 1 (mod 2^64)
	mixC2Inv = 0x9cb4b2f8129337db // mixC2 * mixC2Inv == 1 (mod 2^64)
)

// mix is murmur3's 64-bit finalizer: a bijection on uint64.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= mixC1
	x ^= x >> 33
	x *= mixC2
	x ^= x >> 33
	return x
}

// unmix inverts mix. x ^= x>>33 is its own inverse because 2·33 ≥ 64.
func unmix(x uint64) uint64 {
	x ^= x >> 33
	x *= mixC2Inv
	x ^= x >> 33
	x *= mixC1Inv
	x ^= x >> 33
	return x
}
