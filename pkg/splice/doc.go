// Package splice is kvgate's kernel data path: an eBPF sockmap splice that
// implements datapath.BodyLeg, and a BPF map of per-endpoint load.
//
// Programs (bpf/splice.c, compiled by bpf2go into the committed
// splice_bpfel.go/.o and splice_bpfeb.go/.o, one per byte order; gen.go):
//   - splice_verdict (sk_skb stream verdict on the `backends` sockhash):
//     redirects each skb arriving on a backend socket to its client socket's
//     egress (`clients` sockhash), counting bytes and last activity per pair
//     (`pairs`), per endpoint (`ep_loads`) and in total (`totals`).
//   - endpoint_load (sock_ops on the cgroup v2 root): counts established
//     connections to the addresses registered in `endpoints`.
//
// Knobs: Config.PinDir (--bpf-pin-dir, default /sys/fs/bpf/kvgate),
// Config.Instance (pin subdirectory), Config.Threshold (64 KiB),
// Config.CgroupPath. Metrics (through datapath.Stats, wired by the daemon to
// pkg/metrics): kvgate_datapath_info{path}, kvgate_spliced_bytes_total{path}.
// See docs/body-leg.md for the design and its failure cases.
package splice
