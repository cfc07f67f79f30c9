#!/usr/bin/python3
"""Generate sglang_event_vectors.json: SGLang KV-event payloads in every wire
shape, built the way SGLang builds them, and what each must decode to.

  /usr/bin/python3 gen_sglang_event_vectors.py --sglang-dir D --hash-vectors ../../../kvhash/testdata/engines/engine_hash_vectors.json

This script holds no engine code. --sglang-dir holds events_recorder.py, a copy
of KVCacheEventRecorder (enqueue/take) from SGLang's mem_cache/events.py (see
docs/engines.md for the commit); it runs as is, against the event classes
declared below, and coalesces the per-page BlockStored events that
record_store would enqueue. python3-msgspec is not in Debian, so the classes
are plain Python and the payload is written with python3-msgpack exactly as
msgspec writes SGLang's structs:
  * array_like structs (EventBatch always; KVCacheEvent before SGLang dropped
    array_like) are arrays of every field in declaration order, the tag
    first for tagged ones; msgspec ignores omit_defaults for array_like, so
    trailing defaults (medium, attn_dp_rank) are written as nil;
  * tagged non-array structs are maps with "type" first, then the fields in
    declaration order, fields equal to their default left out
    (omit_defaults); a required Optional field (parent_block_hash, lora_id)
    is always written;
  * ints in their shortest msgpack form (uint for >= 0, int for < 0), floats
    as float64, str as str.
The block hashes are SGLang's published values from engine_hash_vectors.json.
"""
import argparse
import enum
import json
import sys
import types

import msgpack


class StorageMedium(str, enum.Enum):
    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class BlockStored:
    # Field order and defaults of the current BlockStored (after array_like
    # was dropped): block_hashes, parent_block_hash, token_ids, block_size,
    # lora_id, medium=None, cache_salt=None, session_id=None, lora_name=None.
    fields = [("block_hashes", None, True), ("parent_block_hash", None, True), ("token_ids", None, True),
              ("block_size", None, True), ("lora_id", None, True), ("medium", None, False),
              ("cache_salt", None, False), ("session_id", None, False), ("lora_name", None, False)]

    def __init__(self, **kw):
        for name, default, _ in self.fields:
            setattr(self, name, kw.get(name, default))


class BlockRemoved:
    fields = [("block_hashes", None, True), ("medium", None, False)]

    def __init__(self, **kw):
        for name, default, _ in self.fields:
            setattr(self, name, kw.get(name, default))


class AllBlocksCleared:
    fields = []


def wire_value(v):
    return v.value if isinstance(v, enum.Enum) else v


def as_map(ev):
    out = {"type": type(ev).__name__}
    for name, default, required in ev.fields:
        v = wire_value(getattr(ev, name))
        if required or v != default:
            out[name] = v
    return out


def as_array(ev, nfields):
    return [type(ev).__name__] + [wire_value(getattr(ev, n)) for n, _, _ in ev.fields[:nfields]]


def install_fake_sglang():
    for name in ["sglang", "sglang.srt", "sglang.srt.disaggregation"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    kv = types.ModuleType("sglang.srt.disaggregation.kv_events")
    kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared, kv.StorageMedium = BlockStored, BlockRemoved, AllBlocksCleared, StorageMedium
    sys.modules["sglang.srt.disaggregation.kv_events"] = kv


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True).hex()


def expect(events, rank=None, **counts):
    out = {"events": [], "attn_dp_rank": rank}
    out.update(counts)
    for ev in events:
        d = {"type": type(ev).__name__}
        for name, _, _ in ev.fields:
            d[name] = wire_value(getattr(ev, name))
        out["events"].append(d)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-dir", required=True)
    ap.add_argument("--hash-vectors", required=True)
    a = ap.parse_args()
    install_fake_sglang()
    sys.path.insert(0, a.sglang_dir)
    import events_recorder  # SGLang's own KVCacheEventRecorder

    hv = {c["name"]: c for c in json.load(open(a.hash_vectors))["sglang"]}
    chain = hv["multi_page_chain"]   # page 2: 4 pages, both signs
    salted = hv["cache_salt"]       # page 2, salt tenant-a: 3 pages
    lora = hv["cache_salt_and_lora"]
    ts = 1767225600.25

    def pages(case, **kw):
        # One BlockStored per page, as record_store enqueues them.
        ps, toks, hs = case["page_size"], case["tokens"], case["hashes_i64"]
        evs, parent = [], None
        for i, h in enumerate(hs):
            evs.append(BlockStored(block_hashes=[h], parent_block_hash=parent, token_ids=toks[i * ps:(i + 1) * ps],
                                   block_size=ps, lora_id=None, **kw))
            parent = h
        return evs

    def recorded(evs):
        rec = events_recorder.KVCacheEventRecorder(enabled=True, page_size=2)
        for e in evs:
            rec.enqueue(e)
        return rec.take()

    cases = []
    # 1. Oldest SGLang (kv_events.py @ 006d053f): [ts, events], 5-field
    #    BlockStored, BlockRemoved without medium, one event per page.
    evs = pages(chain)
    rm = BlockRemoved(block_hashes=chain["hashes_i64"][2:])
    payload = [ts, [as_array(e, 5) for e in evs] + [as_array(rm, 1), as_array(AllBlocksCleared(), 0)]]
    cases.append({"name": "legacy_array_no_medium_no_rank", "hex": pack(payload),
                  "expect": expect(evs + [rm, AllBlocksCleared()])})
    # 2. Array shape with medium and attn_dp_rank (always written, nil when unset).
    for rank, medium in [(None, StorageMedium.GPU), (3, StorageMedium.CPU), (0, StorageMedium.DISK), (1, StorageMedium.EXTERNAL)]:
        evs = recorded(pages(chain, medium=medium))
        rm = BlockRemoved(block_hashes=chain["hashes_i64"][:1], medium=medium)
        payload = [ts, [as_array(e, 6) for e in evs] + [as_array(rm, 2)], rank]
        cases.append({"name": "legacy_array_medium_%s_rank_%s" % (medium.value, rank), "hex": pack(payload),
                      "expect": expect(evs + [rm], rank)})
    # 3. Array shape, medium nil (the default, always written under array_like).
    evs = pages(chain)[:1]
    cases.append({"name": "legacy_array_medium_nil", "hex": pack([ts, [as_array(e, 6) for e in evs], None]),
                  "expect": expect(evs)})
    # 4. BlockStoredWithMetadata: the array gains a trailing {"cache_salt": ...} map.
    evs = recorded(pages(salted, medium=StorageMedium.GPU, cache_salt="tenant-a"))
    arr = [as_array(e, 6) + [{"cache_salt": e.cache_salt}] for e in evs]
    cases.append({"name": "legacy_array_with_metadata_cache_salt", "hex": pack([ts, arr, 0]), "expect": expect(evs, 0)})
    # 5. Tagged maps, coalesced by KVCacheEventRecorder: one BlockStored per chain.
    evs = recorded(pages(chain) + pages(salted, medium=StorageMedium.CPU, cache_salt="tenant-a", session_id="s-1")
                   + pages(lora, cache_salt="tenant-a", lora_name="adapter-a"))
    evs += recorded([BlockRemoved(block_hashes=[h], medium=StorageMedium.GPU) for h in chain["hashes_i64"]])
    evs.append(AllBlocksCleared())
    cases.append({"name": "map_coalesced_salt_session_lora", "hex": pack([ts, [as_map(e) for e in evs], 2]),
                  "expect": expect(evs, 2)})
    # 6. Maps with an unknown key (ignored, counted) and keys in another order.
    ev = BlockStored(block_hashes=[chain["hashes_i64"][0]], parent_block_hash=None, token_ids=[10, 20], block_size=2, lora_id=7)
    m = as_map(ev)
    m2 = {"future_field": [1, {"x": None}], **{k: m[k] for k in reversed(list(m))}}
    cases.append({"name": "map_unknown_key_any_order", "hex": pack([ts, [m2], None]),
                  "expect": expect([ev], None, unknown_fields=1)})
    # 7. What SGLang's typed decoder rejects or skips: EAGLE bigram token
    #    pairs, an unknown tag; the rest of the batch stands.
    good = pages(chain)[:1]
    bigram = as_array(good[0], 5)
    bigram[3] = [[10, 20], [20, 30]]
    cases.append({"name": "bigram_tokens_rejected_unknown_tag_skipped", "hex": pack([ts, [bigram, ["FutureEvent", 1, 2], as_array(good[0], 5)], None]),
                  "expect": expect(good, None, bad_events=1, unknown_events=1)})
    doc = {
        "provenance": {
            "generator": "pkg/kvevents/sglang/testdata/gen_sglang_event_vectors.py, /usr/bin/python3 %s, python3-msgpack %s" % (sys.version.split()[0], msgpack.version),
            "recorder": "sgl-project/sglang python/sglang/srt/mem_cache/events.py @ 06f643f402f0d7e1c4fd480f6854b742fa642951, KVCacheEventRecorder.enqueue/take (coalescing), executed",
            "schemas": "python/sglang/srt/disaggregation/kv_events.py @ 006d053f182f9b488d2bd841afa06d5f9120a258 (oldest: no medium, no rank); the medium/StorageMedium/BlockStoredWithMetadata versions and the map shape after array_like was dropped, as docs/engines.md lists",
            "encoding": "python3-msgpack reproducing msgspec (see the generator's docstring); python3-msgspec is not packaged in Debian",
        },
        "cases": cases,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
