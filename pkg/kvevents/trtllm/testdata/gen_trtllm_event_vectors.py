#!/usr/bin/python3
"""Generate trtllm_event_vectors.json: bodies of trtllm-serve's
POST /kv_cache_events drain, written by TensorRT-LLM's own serializer, and
what each must decode to.

  /usr/bin/python3 gen_trtllm_event_vectors.py --trtllm-dir D > trtllm_event_vectors.json

This script holds no engine code. --trtllm-dir holds serializer.py (the
KVCacheEventSerializer class of tensorrt_llm/_utils.py) and kv_cache_hash.py
(tensorrt_llm/runtime/kv_cache_hash.py), copied from TensorRT-LLM at the
commits docs/engines.md names. The serializer dispatches on the event data's
class name, so the events below are plain objects of the C++ binding's class
names (KVCacheStoredData, ...) with the attributes the binding exposes; block
hashes come from hash_v1_block_key. The body is what FastAPI's JSONResponse
writes for the serialized list: json.dumps(..., ensure_ascii=False,
separators=(",", ":")).
"""
import argparse
import importlib.util
import json
import os
import sys


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def cls(name):
    return type(name, (Obj,), {})


KVCacheCreatedData = cls("KVCacheCreatedData")
KVCacheStoredData = cls("KVCacheStoredData")
KVCacheStoredBlockData = cls("KVCacheStoredBlockData")
KVCacheRemovedData = cls("KVCacheRemovedData")
KVCacheUpdatedData = cls("KVCacheUpdatedData")
KVCacheEventDiff = cls("KVCacheEventDiff")
UniqueToken = cls("UniqueToken")
KVCacheEvent = cls("KVCacheEvent")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trtllm-dir", required=True)
    a = ap.parse_args()
    ser = load(os.path.join(a.trtllm_dir, "serializer.py"), "trt_ser").KVCacheEventSerializer
    kh = load(os.path.join(a.trtllm_dir, "kv_cache_hash.py"), "trt_hash")

    def chain(tokens, bs, parent=0, lora=None, salt=None):
        sid = kh.get_cache_salt_id(salt) if salt else None
        out = []
        for i in range(len(tokens) // bs):
            parent = kh.hash_v1_block_key(tokens[i * bs:(i + 1) * bs], parent_hash=parent, lora_task_id=lora, cache_salt_id=sid)
            out.append(parent)
        return out

    def blocks(tokens, bs, hashes, level=0, prio=35, extra=0):
        return [KVCacheStoredBlockData(block_hash=h, tokens=[UniqueToken(token_id=t, token_extra_id=extra) for t in tokens[i * bs:(i + 1) * bs]],
                                       lora_id=None, cache_level=level, priority=prio) for i, h in enumerate(hashes)]

    def ev(eid, data, rank=None, window=4096):
        return KVCacheEvent(event_id=eid, data=data, window_size=window, attention_dp_rank=rank)

    toks = list(range(100, 196))  # 3 blocks of 32
    h = chain(toks, 32)
    toks2 = toks[:32] + list(range(500, 532))
    h2 = chain(toks2, 32)
    partial = toks2 + [7, 8, 9]
    hp = h2 + [kh.hash_v1_block_key(partial[64:], parent_hash=h2[-1])]
    hl = chain(toks[:64], 32, lora=7)
    hs = chain(toks[:32], 32, salt="tenant-a")

    cases = []

    def case(name, events, note):
        body = json.dumps(ser.serialize(events), ensure_ascii=False, separators=(",", ":"))
        cases.append({"name": name, "note": note, "body": body})

    case("created_stored_removed_updated", [
        ev(0, KVCacheCreatedData(num_blocks_per_cache_level=[1024, 4096])),
        ev(1, KVCacheStoredData(parent_hash=None, blocks=blocks(toks, 32, h))),
        ev(2, KVCacheStoredData(parent_hash=h[0], blocks=blocks(toks2[32:], 32, h2[1:]))),
        ev(3, KVCacheUpdatedData(block_hash=h[2], cache_level=KVCacheEventDiff(new_value=1, old_value=0), priority=KVCacheEventDiff(new_value=35, old_value=35))),
        ev(4, KVCacheRemovedData(block_hashes=[h[2], h[1]])),
    ], "one rank; hashes above 2^63 stay exact")
    case("attention_dp_ranks", [
        ev(10, KVCacheStoredData(parent_hash=None, blocks=blocks(toks[:64], 32, h[:2])), rank=0),
        ev(11, KVCacheStoredData(parent_hash=None, blocks=blocks(toks[:32], 32, h[:1])), rank=1),
        ev(12, KVCacheRemovedData(block_hashes=[h[0], h[1]]), rank=0),
    ], "ranks unioned: h0 survives rank 0's removal because rank 1 holds it")
    case("partial_block_lora_salt", [
        ev(20, KVCacheStoredData(parent_hash=None, blocks=blocks(partial, 32, hp[:2]) + [KVCacheStoredBlockData(block_hash=hp[2], tokens=[UniqueToken(token_id=t, token_extra_id=0) for t in partial[64:]], lora_id=None, cache_level=0, priority=35)])),
        ev(21, KVCacheStoredData(parent_hash=None, blocks=blocks(toks[:64], 32, hl))),
        ev(22, KVCacheStoredData(parent_hash=None, blocks=blocks(toks[:32], 32, hs))),
    ], "a trailing partial block (3 tokens) is published but never a full-block match; lora_task_id 7 and salt tenant-a change the hashes")
    case("empty_drain", [], "nothing happened since the last drain")

    doc = {
        "provenance": {
            "generator": "pkg/kvevents/trtllm/testdata/gen_trtllm_event_vectors.py, /usr/bin/python3 " + sys.version.split()[0],
            "serializer": "NVIDIA/TensorRT-LLM tensorrt_llm/_utils.py KVCacheEventSerializer (stored blob ed53795b33fc139493f762a1c6c53f691cf52d38), executed",
            "hashes": "tensorrt_llm/runtime/kv_cache_hash.py @ 991de58c52acf039626cabc30e7c4f4106d222fd hash_v1_block_key, get_cache_salt_id, executed",
            "hashes_by_name": {"h": [str(x) for x in h], "h2": [str(x) for x in h2], "partial": [str(x) for x in hp], "lora7": [str(x) for x in hl], "salt": [str(x) for x in hs]},
        },
        "cases": cases,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
