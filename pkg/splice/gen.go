package splice

// The generated splice_bpfel.go/.o are committed, so building needs no clang.
// `make generate` (Debian's clang, llvm and libbpf-dev) rebuilds them from bpf/.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type pair -type ep_load -type ep_key -type conn_state splice ../../bpf/splice.c -- -I../../headers
