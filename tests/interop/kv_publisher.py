#!/usr/bin/python3
"""A vLLM-style KV-event publisher on real libzmq (Debian python3-zmq).

It binds a PUB socket and a ROUTER replay socket exactly as vLLM's
ZmqEventPublisher does, and takes commands as JSON lines on stdin:

  {"op": "pub",  "seq": N, "payload_hex": "...", "topic": "kv-events"}  publish + buffer
  {"op": "buf",  "seq": N, "payload_hex": "..."}                        buffer only (a batch the subscriber missed)
  {"op": "pack", "seq": N, "batch": [...], "live": true}                msgpack-encode batch with python3-msgpack
  {"op": "frames", "frames_hex": ["..", "..", ".."], "seq": N, "payload_index": 2}
                                                                         publish raw frames (and buffer them)
  {"op": "reset"}                                                        empty the replay buffer
  {"op": "quit"}

It prints "ready" once bound and "ok" after each command.
Replay protocol (vLLM): the ROUTER receives [identity, b"", seq8]; for each
buffered batch with seq >= start it sends, in the current layout (vLLM
since mid-2026, docs/parity.md), [identity, b"", topic, seq8, payload], then
[identity, b"", b"", 0xFF*8, b""]; in the legacy layout
[identity, b"", seq8, payload], then [identity, b"", 0xFF*8, b""].

Usage: kv_publisher.py PUB_ENDPOINT REPLAY_ENDPOINT [current|legacy [TOPIC]]
"""
import json
import sys

import msgpack
import zmq

END_SEQ = b"\xff" * 8


def main():
    pub_ep, replay_ep = sys.argv[1], sys.argv[2]
    layout = sys.argv[3] if len(sys.argv) > 3 else "current"
    replay_topic = (sys.argv[4] if len(sys.argv) > 4 else "kv-events").encode()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100000)
    pub.bind(pub_ep)
    router = ctx.socket(zmq.ROUTER)
    router.bind(replay_ep)
    buffer = []  # (seq, payload)

    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    print("ready", flush=True)

    def seq8(n):
        return int(n).to_bytes(8, "big")

    while True:
        for sock, _ in poller.poll():
            if sock is router:
                frames = router.recv_multipart()
                if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                    continue  # vLLM ignores other shapes
                ident, start = frames[0], int.from_bytes(frames[2], "big")
                for seq, payload in buffer:
                    if seq >= start:
                        if layout == "legacy":
                            router.send_multipart([ident, b"", seq8(seq), payload])
                        else:
                            router.send_multipart([ident, b"", replay_topic, seq8(seq), payload])
                if layout == "legacy":
                    router.send_multipart([ident, b"", END_SEQ, b""])
                else:
                    router.send_multipart([ident, b"", b"", END_SEQ, b""])
                continue
            line = sys.stdin.readline()
            if not line:
                return
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "quit":
                print("ok", flush=True)
                return
            if op == "reset":
                buffer.clear()
            elif op in ("pub", "buf"):
                payload = bytes.fromhex(cmd["payload_hex"])
                buffer.append((cmd["seq"], payload))
                if op == "pub":
                    topic = cmd.get("topic", "kv-events").encode()
                    pub.send_multipart([topic, seq8(cmd["seq"]), payload])
            elif op == "pack":
                payload = msgpack.packb(cmd["batch"], use_bin_type=True)
                buffer.append((cmd["seq"], payload))
                if cmd.get("live", True):
                    pub.send_multipart([b"kv-events", seq8(cmd["seq"]), payload])
            elif op == "frames":
                frames = [bytes.fromhex(f) for f in cmd["frames_hex"]]
                buffer.append((cmd["seq"], frames[cmd.get("payload_index", 2)]))
                pub.send_multipart(frames)
            print("ok", flush=True)


if __name__ == "__main__":
    main()
