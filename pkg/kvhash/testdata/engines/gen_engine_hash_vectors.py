#!/usr/bin/python3
"""Generate engine_hash_vectors.json by executing SGLang's and TensorRT-LLM's own
hashing code. This script holds no engine code: it loads the engines' functions
from the directories given on the command line (files copied out of the engines'
repositories, see docs/engines.md for the files and commits) and records what
they return. Never edit the JSON by hand.

  /usr/bin/python3 gen_engine_hash_vectors.py --sglang-dir D1 --trtllm-dir D2 > engine_hash_vectors.json

--sglang-dir holds:
  hasher            SGLang's native page hasher (cpp_utils/hash_binding.cpp,
                    the hash_pages_to_hex_blob path over uint64 token buffers)
                    built with g++ -lcrypto behind a stdin/stdout driver;
  parity_script.py  namespaced_hashes / hash_page_chain from SGLang's
                    sgl-router fixture generator (salt prior, LoRA namespacing);
  utils_hash.py     hash_str_to_int64 from mem_cache/utils.py.
--trtllm-dir holds kv_cache_hash.py (tensorrt_llm/runtime/kv_cache_hash.py).
"""
import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def native_pages(hasher, tokens, page_size, prior):
    line = "%d %s %d %s\n" % (page_size, prior.hex() if prior else "-", len(tokens), " ".join(str(t) for t in tokens))
    out = subprocess.run([hasher], input=line, capture_output=True, text=True, check=True).stdout.strip()
    if out.startswith("ERROR"):
        return None, out[len("ERROR "):]
    return (out.split() if out else []), None


def sglang_cases(d):
    parity = load(os.path.join(d, "parity_script.py"), "sg_parity")
    utils = load(os.path.join(d, "utils_hash.py"), "sg_utils")
    hasher = os.path.join(d, "hasher")
    big = list(range(1, 131))
    specs = [
        ("single_page", [1, 2, 3, 4], 4, None, None),
        ("partial_last_page_not_published", [1, 2, 3, 4, 5], 4, None, None),
        ("multi_page_chain", [10, 20, 30, 40, 50, 60, 70, 80], 2, None, None),
        ("page_size_one", [7, 8, 9], 1, None, None),
        ("long_chain_16", big, 16, None, None),
        ("shorter_than_a_page", [1, 2, 3], 4, None, None),
        ("cache_salt", [1, 2, 3, 4, 5, 6], 2, "tenant-a", None),
        ("cache_salt_unicode", [1, 2, 3, 4], 4, "t\u00e9nant-\u03b2", None),
        ("lora", [1, 2, 3, 4], 2, None, "adapter-a"),
        ("cache_salt_and_lora", [1, 2, 3, 4, 5], 2, "tenant-a", "adapter-a"),
        ("tokens_ge_2p31", [2**31, 2**31 + 1, 2**32 - 1, 5], 2, None, None),
        ("tokens_ge_2p32_wide_page", [1, 2, 2**32, 4, 5, 6], 2, None, None),
        ("tokens_ge_2p32_max_int64", [2**63 - 1, 3, 9, 9], 2, None, None),
        ("tokens_ge_2p32_with_salt_lora", [2**40 + 7, 1, 2, 3], 2, "tenant-a", "adapter-a"),
    ]
    out = []
    for name, toks, ps, salt, lora in specs:
        prior = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).digest() if salt is not None else None
        digests, err = native_pages(hasher, toks, ps, prior)
        assert err is None, (name, err)
        full = len(toks) // ps
        # The engine publishes full pages only (radix keys are page aligned).
        digests = digests[:full]
        raw = [utils.hash_str_to_int64(h) for h in digests]
        if lora is not None:
            seed = hashlib.sha256(b"sglang-kv-event-lora-v1\0" + lora.encode()).digest()
            pub = [int.from_bytes(hashlib.sha256(seed + h.to_bytes(8, "big", signed=True)).digest()[:8], "big", signed=True) for h in raw]
        else:
            pub = raw
        if all(t < 2**32 for t in toks):
            # Cross-check the native hasher against SGLang's Python chain.
            py = parity.namespaced_hashes(toks, ps, salt, lora)[:full]
            assert py == pub, (name, py, pub)
        case = {"name": name, "tokens": toks, "page_size": ps, "digests_hex": digests, "hashes_i64": pub}
        if salt is not None:
            case["cache_salt"] = salt
        if lora is not None:
            case["lora_name"] = lora
        out.append(case)
    rejected = []
    for name, toks in [("token_above_int64", [2**63]), ]:
        _, err = native_pages(hasher, toks, 1, None)
        assert err is not None
        rejected.append({"name": name, "tokens": toks, "page_size": 1, "error": err})
    return out, rejected


def trtllm_cases(d):
    kh = load(os.path.join(d, "kv_cache_hash.py"), "trt_hash")
    specs = [
        ("single_block", list(range(1, 33)), 32, None, None),
        ("multi_block_chain", list(range(100, 196)), 32, None, None),
        ("partial_last_block_not_hashed", list(range(1, 41)), 32, None, None),
        ("small_blocks", [5, 6, 7, 8, 9, 10, 11, 12], 4, None, None),
        ("lora_task_id", list(range(1, 9)), 4, 7, None),
        ("lora_task_id_zero", list(range(1, 9)), 4, 0, None),
        ("lora_task_id_large", list(range(1, 9)), 4, 2**64 - 3, None),
        ("cache_salt", list(range(1, 9)), 4, None, "tenant-a"),
        ("cache_salt_and_lora", list(range(1, 13)), 4, 42, "tenant-a"),
        ("tokens_ge_2p31", [2**31, 2**31 + 5, 2**32 - 1, 0], 4, None, None),
        ("block_size_one", [3, 1, 4], 1, None, None),
    ]
    out = []
    for name, toks, bs, lora, salt in specs:
        salt_id = kh.get_cache_salt_id(salt) if salt is not None else None
        parent = 0
        hashes = []
        for i in range(len(toks) // bs):
            parent = kh.hash_v1_block_key(toks[i * bs:(i + 1) * bs], parent_hash=parent, lora_task_id=lora, cache_salt_id=salt_id)
            hashes.append(parent)
        case = {"name": name, "tokens": toks, "block_size": bs, "hashes_u64": hashes}
        if lora is not None:
            case["lora_task_id"] = lora
        if salt is not None:
            case["cache_salt"] = salt
            case["cache_salt_id"] = salt_id
        out.append(case)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-dir", required=True)
    ap.add_argument("--trtllm-dir", required=True)
    a = ap.parse_args()
    sg, sg_rej = sglang_cases(a.sglang_dir)
    doc = {
        "provenance": {
            "generator": "pkg/kvhash/testdata/engines/gen_engine_hash_vectors.py, run with /usr/bin/python3 " + sys.version.split()[0],
            "sglang": {
                "repository": "sgl-project/sglang",
                "native_hasher": "python/sglang/srt/mem_cache/cpp_utils/hash_binding.cpp @ 30a90c4f837192e0aa4dafcc12e38c315fb4185c (hash_pages_to_hex_blob over a uint64 buffer, built with Debian g++ and libcrypto)",
                "namespacing": "experimental/sgl-router/tests/scripts/generate_kv_events_hash_parity.py (namespaced_hashes, hash_page_chain), which mirrors mem_cache/events.py @ 06f643f402f0d7e1c4fd480f6854b742fa642951 (kv_event_lora_seed, namespace_event_block_hash)",
                "int64": "python/sglang/srt/mem_cache/utils.py hash_str_to_int64",
                "notes": "digests_hex are the raw page digests (the next page's prior); hashes_i64 are the published values, full pages only. Cases with tokens >= 2^32 take their salt prior and LoRA namespace from the same formulas as namespaced_hashes; all other cases assert that the native hasher and namespaced_hashes agree."
            },
            "trtllm": {
                "repository": "NVIDIA/TensorRT-LLM",
                "file": "tensorrt_llm/runtime/kv_cache_hash.py @ 991de58c52acf039626cabc30e7c4f4106d222fd",
                "functions": "hash_v1_block_key (bit-exact mirror of cpp/tensorrt_llm/batch_manager/blockKey.cpp BlockKeyHasher::hash), get_cache_salt_id (SHA-256, first 8 bytes little-endian)",
                "notes": "full blocks only, each block's parent is the previous block's hash, the first block's parent is 0. The engine stores blocks over all prompt tokens but the last (kvCacheManager.cpp storeBlocks usableSize = size - 1); these vectors hash exactly the tokens listed."
            }
        },
        "sglang": sg,
        "sglang_rejected": sg_rej,
        "trtllm": trtllm_cases(a.trtllm_dir),
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
