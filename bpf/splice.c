// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// kvgate's kernel data path.
//
// splice_verdict: an SK_SKB stream-verdict program attached to the
// `backends` SOCKHASH. Every skb that arrives on a backend socket in that map
// is redirected to the egress of the client socket its pair names (in the
// `clients` SOCKHASH, which has no programs, so client ingress stays with
// userspace). It counts bytes and last activity per pair and per endpoint.
//
// endpoint_load: a sock_ops program on the cgroup v2 root. It counts the
// established TCP connections towards the endpoints listed in `endpoints`
// (filled by kvgate), decrementing exactly once when such a connection
// leaves ESTABLISHED.
//
// Keys: sockets are keyed by their socket cookie (SO_COOKIE), which is unique
// for the life of the kernel and readable from both userspace and BPF.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MAX_PAIRS 65536
#define MAX_ENDPOINTS 256
#define NO_ENDPOINT 0xffffffff
// Bytes of the redirected stream's end kept per pair: enough for a chunked
// body's last chunk ("\r\n0\r\n\r\n") with a short trailer, so kvgate can
// tell a complete body from one the backend cut (docs/body-leg.md,
// "Broken responses").
#define TAIL_LEN 32

// TCP states (include/net/tcp_states.h), not in the UAPI headers.
#define KV_TCP_ESTABLISHED 1

// One spliced response: backend socket -> client socket.
struct pair {
	__u64 client_cookie; // key of the client in `clients`
	__u32 endpoint;      // index into ep_load, or NO_ENDPOINT
	__u32 _pad;
	__u64 bytes;         // body bytes redirected by the kernel
	__u64 first_ns;      // bpf_ktime_get_ns of the first redirected byte
	__u64 last_ns;       // bpf_ktime_get_ns of the latest redirected byte
	__u64 dropped;       // bytes whose redirect found no client
	__u8 tail[TAIL_LEN]; // the last TAIL_LEN redirected bytes, oldest first
};

// Per-endpoint load, the BPF mirror of the proxy's counts.
struct ep_load {
	__u64 active_conns;  // established backend connections (sock_ops)
	__u64 spliced_bytes; // body bytes spliced towards clients
	__u64 first_byte_ns; // first body byte of the latest spliced response
	__u64 streams;       // responses whose first body byte was spliced
};

// Endpoint address: IPv4 as ::ffff:a.b.c.d, port in host order.
struct ep_key {
	__u8 addr[16];
	__u32 port;
};

struct conn_state {
	__u32 endpoint;
	__u32 counted;
	// Set from userspace (Datapath.TagBackend) before connect(): the socket
	// is a backend connection of this instance's proxy. Only tagged sockets
	// are counted, so health probes, metrics scrapes and other instances'
	// connections to the same address are not load.
	__u32 backend;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MAX_PAIRS);
	__type(key, __u64);
	__type(value, __u64);
} backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MAX_PAIRS);
	__type(key, __u64);
	__type(value, __u64);
} clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PAIRS);
	__type(key, __u64); // backend socket cookie
	__type(value, struct pair);
} pairs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct ep_load);
} ep_loads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS * 4);
	__type(key, struct ep_key);
	__type(value, __u32);
} endpoints SEC(".maps");

// Index 0: all bytes this instance spliced, for kvgate_spliced_bytes_total.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

// A spliced backend connection left ESTABLISHED (FIN or RST): tells kvgate
// its response ended without kvgate watching the backend socket per chunk.
struct end_event {
	__u64 cookie;
	__u32 state;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} ends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct conn_state);
} conn_states SEC(".maps");

// keep_tail records the end of the redirected stream in p->tail. The
// verdict of one socket runs under that socket's lock, so the updates of a
// pair are serialised.
static __always_inline void keep_tail(struct __sk_buff *skb, struct pair *p, __u32 len)
{
	if (len >= TAIL_LEN) {
		bpf_skb_load_bytes(skb, len - TAIL_LEN, p->tail, TAIL_LEN);
		return;
	}
	if (len == 0)
		return;
	// A short skb: shift the kept bytes left by n and append it. The masks
	// restate bounds the verifier cannot carry through the loop.
	__u32 n = len & (TAIL_LEN - 1);
	__u8 in[TAIL_LEN] = {};
	if (bpf_skb_load_bytes(skb, 0, in, n) < 0)
		return;
	for (__u32 i = 0; i < TAIL_LEN; i++) {
		__u32 from = i + n;
		if (from < TAIL_LEN)
			p->tail[i] = p->tail[from & (TAIL_LEN - 1)];
		else
			p->tail[i] = in[(from - TAIL_LEN) & (TAIL_LEN - 1)];
	}
}

SEC("sk_skb/stream_verdict")
int splice_verdict(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct pair *p = bpf_map_lookup_elem(&pairs, &cookie);
	if (!p)
		return SK_PASS; // not ours (yet): leave it to userspace

	__u64 len = skb->len;
	// The backend's FIN reaches the verdict as an empty skb. It carries
	// nothing for the client (the end of the response is the backend's
	// RCV_SHUTDOWN, seen by kvgate), and queueing it on the client's psock
	// would leave work pending when the client leaves the map, which the
	// kernel reports on the client socket as EPIPE.
	if (len == 0)
		return SK_DROP;
	long verdict = bpf_sk_redirect_hash(skb, &clients, &p->client_cookie, 0);
	if (verdict != SK_PASS) {
		__sync_fetch_and_add(&p->dropped, len);
		return SK_DROP;
	}
	keep_tail(skb, p, len);
	__u64 now = bpf_ktime_get_ns();
	int first = __sync_fetch_and_add(&p->bytes, len) == 0;
	if (first)
		p->first_ns = now;
	p->last_ns = now;

	__u32 zero = 0;
	__u64 *total = bpf_map_lookup_elem(&totals, &zero);
	if (total)
		__sync_fetch_and_add(total, len);

	__u32 ep = p->endpoint;
	struct ep_load *l = bpf_map_lookup_elem(&ep_loads, &ep);
	if (l) {
		__sync_fetch_and_add(&l->spliced_bytes, len);
		if (first) {
			l->first_byte_ns = now;
			__sync_fetch_and_add(&l->streams, 1);
		}
	}
	return verdict;
}

static __always_inline int remote_endpoint(struct bpf_sock_ops *ops, __u32 *ep)
{
	struct ep_key k = {};
	if (ops->family == 2 /* AF_INET */) {
		__u32 ip = ops->remote_ip4;
		k.addr[10] = 0xff;
		k.addr[11] = 0xff;
		__builtin_memcpy(&k.addr[12], &ip, 4);
	} else if (ops->family == 10 /* AF_INET6 */) {
		__u32 w;
		w = ops->remote_ip6[0];
		__builtin_memcpy(&k.addr[0], &w, 4);
		w = ops->remote_ip6[1];
		__builtin_memcpy(&k.addr[4], &w, 4);
		w = ops->remote_ip6[2];
		__builtin_memcpy(&k.addr[8], &w, 4);
		w = ops->remote_ip6[3];
		__builtin_memcpy(&k.addr[12], &w, 4);
	} else {
		return 0;
	}
	// remote_port holds the network-order port in its upper 16 bits on
	// little-endian hosts (sock_ops shifts it), so ntohl yields the port.
	k.port = bpf_ntohl(ops->remote_port);
	__u32 *v = bpf_map_lookup_elem(&endpoints, &k);
	if (!v)
		return 0;
	*ep = *v;
	return 1;
}

SEC("sockops")
int endpoint_load(struct bpf_sock_ops *ops)
{
	switch (ops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB: {
		// Every active connection reports its state changes: any of them
		// may become a spliced backend connection, whose end kvgate learns
		// from STATE_CB below.
		bpf_sock_ops_cb_flags_set(ops, ops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
		struct bpf_sock *sk = ops->sk;
		if (!sk)
			return 1;
		struct conn_state *st = bpf_sk_storage_get(&conn_states, sk, 0, 0);
		if (!st || !st->backend || st->counted)
			return 1;
		__u32 ep;
		if (!remote_endpoint(ops, &ep))
			return 1;
		struct ep_load *l = bpf_map_lookup_elem(&ep_loads, &ep);
		if (!l)
			return 1;
		st->endpoint = ep;
		st->counted = 1;
		__sync_fetch_and_add(&l->active_conns, 1);
		return 1;
	}
	case BPF_SOCK_OPS_STATE_CB: {
		// args[0] old state, args[1] new state.
		if (ops->args[1] == KV_TCP_ESTABLISHED)
			return 1;
		__u64 cookie = bpf_get_socket_cookie(ops);
		if (bpf_map_lookup_elem(&pairs, &cookie)) {
			struct end_event *e = bpf_ringbuf_reserve(&ends, sizeof(*e), 0);
			if (e) {
				e->cookie = cookie;
				e->state = ops->args[1];
				e->_pad = 0;
				bpf_ringbuf_submit(e, 0);
			}
		}
		struct bpf_sock *sk = ops->sk;
		if (!sk)
			return 1;
		struct conn_state *st = bpf_sk_storage_get(&conn_states, sk, 0, 0);
		if (!st || !st->counted)
			return 1;
		st->counted = 0;
		__u32 ep = st->endpoint;
		struct ep_load *l = bpf_map_lookup_elem(&ep_loads, &ep);
		if (l)
			__sync_fetch_and_sub(&l->active_conns, 1);
		return 1;
	}
	}
	return 1;
}
