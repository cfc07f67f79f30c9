package splice

// The generated splice_bpfel.go/.o (little-endian architectures) and
// splice_bpfeb.go/.o (big-endian: s390x, ppc64, mips…) are committed, so
// building needs no clang, and the loader builds for every Linux
// architecture, as cilium/ebpf's examples do. Both carry the linux build tag:
// elsewhere other.go's userspace fallback stands alone.
//
// `make generate` rebuilds them from bpf/splice.c with Debian's clang, llvm
// (llvm-strip drops DWARF, so the objects do not depend on the build path)
// and the UAPI headers: <linux/bpf.h> and libbpf-dev's <bpf/bpf_helpers.h>.
// headers/asm holds three shims so that <linux/bpf.h> does not need the
// host's multiarch include directory; docs/body-leg.md ("Building the BPF
// objects") has the details.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel,bpfeb -tags linux -type pair -type ep_load -type ep_key -type conn_state splice ../../bpf/splice.c -- -I../../headers
