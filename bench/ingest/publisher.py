#!/usr/bin/python3
"""One vLLM-style KV-event publisher for bench/ingest, on real libzmq.

It binds a PUB socket and a replay ROUTER as vLLM's ZmqEventPublisher does
(the same frames as tests/interop/kv_publisher.py: [topic, seq8, payload]
live, [identity, b"", b"", 0xFF*8, b""] as the end of a replay; this
publisher keeps no replay buffer, so every replay is empty). Payloads are
vLLM's map-layout KVEventBatch, msgpack-encoded with python3-msgpack.

Every payload is encoded before it is timed, so the publisher spends its
timed loop in send_multipart only. Commands, one JSON line each on stdin:

  {"op": "gen", "live": N, "pool": M, "batch": B, "tokens": bool}
      draw N + M unique random 64-bit hashes and encode one BlockStored and
      one BlockRemoved payload per B hashes; the first N are the fill, the
      rest rotate in during churn
  {"op": "warm"}      publish one single-hash BlockStored (subscription probe)
  {"op": "fill"}      publish the fill's BlockStored payloads back to back
  {"op": "churn", "seconds": S, "rate": R}
      for S seconds at up to R hashes/s (0: as fast as possible), each step
      removes the oldest live batch and stores the next one of the ring
  {"op": "quit"}

Each command answers one JSON line: {"ok": true, ...} with the hashes sent
and the seconds and CPU seconds the sending took.

Usage: publisher.py PUB_ENDPOINT REPLAY_ENDPOINT SEED
"""
import array
import json
import os
import random
import sys
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8
TOPIC = b"kv-events"


class Publisher:
    def __init__(self, pub_ep, replay_ep, seed):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        # 0 = no high-water mark: the benchmark measures how fast kvgate
        # drains, so the publisher must never drop a batch (a drop is a
        # sequence gap, and an empty replay would clear the rank).
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(pub_ep)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(replay_ep)
        self.rng = random.Random(seed)
        self.seq = 0
        self.stores = []
        self.removes = []
        self.live = 0
        self.batch = 1
        self.head = 0  # ring index of the oldest live batch

    def send(self, payload):
        self.pub.send_multipart([TOPIC, self.seq.to_bytes(8, "big"), payload], copy=False)
        self.seq += 1

    def answer_replays(self):
        while self.router.poll(0):
            frames = self.router.recv_multipart()
            if len(frames) == 3 and frames[1] == b"" and len(frames[2]) == 8:
                self.router.send_multipart([frames[0], b"", b"", END_SEQ, b""])

    def gen(self, live, pool, batch, tokens):
        n = live + pool
        hashes = array.array("Q", os.urandom(8 * n))
        token_ids = [self.rng.randrange(151000) for _ in range(16 * batch)] if tokens else None
        self.stores, self.removes = [], []
        for i in range(0, n, batch):
            hs = hashes[i:i + batch].tolist()
            stored = {"type": "BlockStored", "block_hashes": hs,
                      # A parent nobody stored: the live parity check cannot
                      # verify these random hashes, so it counts them
                      # unchecked (parent_unknown) instead of diagnosing.
                      "parent_block_hash": self.rng.getrandbits(64) if tokens else None,
                      "token_ids": token_ids[:16 * len(hs)] if tokens else [],
                      "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
                      "extra_keys": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
            removed = {"type": "BlockRemoved", "block_hashes": hs, "medium": "GPU", "group_idx": 0}
            self.stores.append(msgpack.packb([time.time(), [stored], 0], use_bin_type=True))
            self.removes.append(msgpack.packb([time.time(), [removed], 0], use_bin_type=True))
        self.live = (live + batch - 1) // batch
        self.batch = batch
        self.head = 0
        return {"batches": len(self.stores), "bytes": sum(map(len, self.stores))}

    def warm(self):
        h = self.rng.getrandbits(64)
        self.send(msgpack.packb([time.time(), [{"type": "BlockStored", "block_hashes": [h], "parent_block_hash": None,
                                               "token_ids": [], "block_size": 16, "lora_id": None, "medium": "GPU"}], 0],
                                use_bin_type=True))
        return {"hash": h}

    def fill(self):
        t0, c0 = time.monotonic(), time.process_time()
        sent = 0
        for i in range(self.live):
            self.send(self.stores[i])
            sent += self.batch
            if i % 256 == 0:
                self.answer_replays()
        return {"hashes": sent, "seconds": time.monotonic() - t0, "cpu": time.process_time() - c0}

    def churn(self, seconds, rate):
        ring = len(self.stores)
        if ring <= self.live:
            return {"hashes": 0, "seconds": 0.0, "cpu": 0.0}
        t0, c0 = time.monotonic(), time.process_time()
        end = t0 + seconds
        sent = 0
        steps = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if rate > 0:
                ahead = sent / rate - (now - t0)
                if ahead > 0:
                    time.sleep(min(ahead, end - now))
                    continue
            self.send(self.removes[self.head % ring])
            self.send(self.stores[(self.head + self.live) % ring])
            self.head += 1
            sent += 2 * self.batch
            steps += 1
            if steps % 256 == 0:
                self.answer_replays()
        return {"hashes": sent, "seconds": time.monotonic() - t0, "cpu": time.process_time() - c0}


def main():
    p = Publisher(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    poller = zmq.Poller()
    poller.register(p.router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        events = dict(poller.poll())
        if p.router in events:
            p.answer_replays()
        if sys.stdin.fileno() not in events:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            print(json.dumps({"ok": True}), flush=True)
            return
        if op == "gen":
            out = p.gen(int(cmd["live"]), int(cmd.get("pool", 0)), int(cmd.get("batch", 256)), bool(cmd.get("tokens")))
        elif op == "warm":
            out = p.warm()
        elif op == "fill":
            out = p.fill()
        elif op == "churn":
            out = p.churn(float(cmd["seconds"]), float(cmd.get("rate", 0)))
        else:
            out = {"error": "unknown op " + op}
        out["ok"] = "error" not in out
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
