#!/usr/bin/python3
"""libzmq subscriber for enginesim's KV events (run with Debian's /usr/bin/python3).

Reads batches from a PUB endpoint the way vLLM's example subscriber does, checks
the frames, the sequence numbers, the payload layout and every block hash
(recomputed from token_ids with hashlib + cbor2, vLLM's sha256_cbor), then
fetches a replay over a DEALER socket and compares it with what was received.

Usage: subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT LAYOUT SEED BLOCK_SIZE MAX_BATCHES [REPLAY_LAYOUT TOPIC]

REPLAY_LAYOUT is "current" (vLLM since mid-2026, docs/parity.md: every reply is
[b"", topic, seq8, payload], the end marker [b"", b"", 0xFF*8, b""]) or
"legacy" ([b"", seq8, payload], end [b"", 0xFF*8, b""]).
Reads until a batch holds AllBlocksCleared (the test ends with a reset).
Prints "READY" once subscribed, then one JSON summary line; exits non-zero on a
failed check.
"""

import hashlib
import json
import struct
import sys

import cbor2
import msgpack
import zmq

END_MARKER = b"\xff" * 8


def fail(msg):
    print(json.dumps({"ok": False, "error": msg}), flush=True)
    sys.exit(1)


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def wire(digest):
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def parse_event(ev, layout):
    """Returns (type, fields dict) for either layout."""
    if layout == "map":
        if not isinstance(ev, dict):
            fail("map layout: event is %r" % type(ev))
        keys = list(ev.keys())
        if keys[0] != "type":
            fail("map layout: first key %r, want 'type'" % keys[0])
        return ev["type"], ev
    if not isinstance(ev, list):
        fail("array layout: event is %r" % type(ev))
    tag = ev[0]
    if tag == "BlockStored":
        names = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window"]
    elif tag == "BlockRemoved":
        names = ["block_hashes", "medium", "group_idx"]
    else:
        names = []
    if len(ev) != len(names) + 1:
        fail("array layout: %s has %d positions, want %d" % (tag, len(ev), len(names) + 1))
    return tag, dict(zip(names, ev[1:]))


def main():
    pub_ep, replay_ep, layout, seed, block_size, max_batches = sys.argv[1:7]
    replay_layout = sys.argv[7] if len(sys.argv) > 7 else "legacy"
    topic = (sys.argv[8] if len(sys.argv) > 8 else "").encode()
    block_size, max_batches = int(block_size), int(max_batches)
    none_hash = sha256_cbor(seed)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 20000)
    sub.connect(pub_ep)
    print("READY", flush=True)

    digests = {}  # wire hash -> full digest, to chain children
    received = []  # (seq, payload)
    counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0, "blocks_verified": 0}
    cleared = False
    while not cleared:
        if len(received) >= max_batches:
            fail("no AllBlocksCleared within %d batches" % max_batches)
        try:
            frames = sub.recv_multipart()
        except zmq.Again:
            fail("timed out after %d batches" % len(received))
        if len(frames) != 3:
            fail("%d frames, want 3" % len(frames))
        topic, seq_b, payload = frames
        if len(seq_b) != 8:
            fail("seq frame of %d bytes" % len(seq_b))
        seq = struct.unpack(">Q", seq_b)[0]
        if seq != len(received):
            fail("seq %d, want %d" % (seq, len(received)))
        received.append((seq, payload))
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if not isinstance(batch, list) or len(batch) != 3 or not isinstance(batch[0], float):
            fail("batch is not [ts, events, rank]: %r" % (batch,))
        if batch[2] != 0:
            fail("data_parallel_rank %r, want 0" % (batch[2],))
        if not batch[1]:
            fail("empty batch published")
        for ev in batch[1]:
            typ, f = parse_event(ev, layout)
            counts[typ] = counts.get(typ, 0) + 1
            if typ == "AllBlocksCleared":
                cleared = True
            if typ != "BlockStored":
                if typ == "BlockRemoved" and f.get("medium") != "GPU":
                    fail("BlockRemoved medium %r" % f.get("medium"))
                continue
            if f["medium"] != "GPU" or f["block_size"] != block_size:
                fail("BlockStored medium/block_size %r/%r" % (f["medium"], f["block_size"]))
            hashes, tokens = f["block_hashes"], f["token_ids"]
            if len(tokens) != len(hashes) * block_size:
                fail("%d tokens for %d blocks" % (len(tokens), len(hashes)))
            parent = none_hash
            if f["parent_block_hash"] is not None:
                parent = digests.get(f["parent_block_hash"])
                if parent is None:
                    fail("parent %d never announced" % f["parent_block_hash"])
            extra = f.get("extra_keys")
            if extra is not None and len(extra) != len(hashes):
                fail("%d extra_keys entries for %d blocks" % (len(extra), len(hashes)))
            for i, h in enumerate(hashes):
                block = tokens[i * block_size:(i + 1) * block_size]
                # vLLM hashes (parent, tuple(tokens), extra_keys tuple or None).
                key = extra[i] if extra is not None else None
                d = sha256_cbor([parent, block, key])
                if key is not None:
                    counts["salted_blocks"] = counts.get("salted_blocks", 0) + 1
                if wire(d) != h:
                    fail("block hash %d != recomputed %d" % (h, wire(d)))
                digests[h] = d
                parent = d
                counts["blocks_verified"] += 1

    # Replay everything from seq 0 over a DEALER (a REQ can read one reply only).
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10000)
    dealer.connect(replay_ep)
    dealer.send_multipart([b"", struct.pack(">Q", 0)])
    replayed = []
    while True:
        try:
            frames = dealer.recv_multipart()
        except zmq.Again:
            fail("replay timed out after %d messages" % len(replayed))
        if replay_layout == "current":
            if len(frames) != 4 or frames[0] != b"":
                fail("replay message with %d frames, want 4" % len(frames))
            if frames[2] == END_MARKER:
                if frames[1] != b"":
                    fail("end marker with a topic")
            elif frames[1] != topic:
                fail("replay topic %r, want %r" % (frames[1], topic))
            frames = frames[:1] + frames[2:]
        elif len(frames) != 3 or frames[0] != b"":
            fail("replay message with %d frames, want 3" % len(frames))
        if frames[1] == END_MARKER:
            if frames[2] != b"":
                fail("end marker with a payload")
            break
        replayed.append((struct.unpack(">Q", frames[1])[0], frames[2]))
    if replayed[:len(received)] != received:
        fail("replay differs from the live stream (%d vs %d batches)" % (len(replayed), len(received)))

    counts.update({"ok": True, "batches": len(received), "replayed": len(replayed)})
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
