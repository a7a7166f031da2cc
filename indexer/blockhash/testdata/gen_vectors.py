#!/usr/bin/python3
"""Prints the vectors pinned in vectors_test.go.

Run with Debian's python3, python3-cbor2 (5.4.6) and python3-xxhash (3.2.0,
libxxhash 0.8.1): /usr/bin/python3 testdata/gen_vectors.py. The vLLM part
restates vllm/v1/core/kv_cache_utils.py (hash_block_tokens,
generate_block_hash_extra_keys, init_none_hash) and vllm/utils/hashing.py
(sha256_cbor, xxhash_cbor); the llm-d part restates llm-d-kv-cache
pkg/kvcache/kvblock/token_processor.go (hash, getInitHash, prefixHashes).
"""
import hashlib

import cbor2
import xxhash

MASK = (1 << 64) - 1


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj):
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


def key(digest):  # maybe_convert_block_hash
    return int.from_bytes(digest, "big") & MASK


def vllm_extra_keys(lora, mm, salt, start, end):
    """generate_block_hash_extra_keys for items (id, offset, length), sorted."""
    mm_keys = []
    for ident, off, length in mm:
        if end > off and start < off + length:
            mm_keys.append((ident, off - start))
    keys = ([lora] if lora else []) + mm_keys + ([salt] if start == 0 and salt else [])
    return tuple(keys) if keys else None


def vllm_chain(hash_fn, seed, tokens, bs, lora="", mm=(), salt=""):
    parent = hash_fn(seed)  # init_none_hash
    out = []
    for start in range(0, len(tokens) - bs + 1, bs):
        extra = vllm_extra_keys(lora, mm, salt, start, start + bs)
        parent = hash_fn((parent, tuple(tokens[start:start + bs]), extra))
        out.append(parent)
    return out


def fnv64a(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & MASK
    return h


def llmd_hash(parent, tokens, extra):
    return fnv64a(cbor2.dumps([parent, tokens, extra], canonical=True))


def llmd_chain(seed, name, tokens, bs, mm=()):
    root = llmd_hash(fnv64a(seed.encode()), None, name)
    out, parent = [], root
    for start in range(0, len(tokens) - bs + 1, bs):
        items = [{"Hash": i, "Offset": o - start} for i, o, n in mm if start + bs > o and start < o + n]
        parent = llmd_hash(parent, tokens[start:start + bs], items or None)
        out.append(parent)
    return root, out


print("# vLLM NONE_HASH: sha256_cbor, xxhash_cbor")
for seed in ["", "0", "42", "vllm-none-hash"]:
    print(repr(seed), sha256_cbor(seed).hex(), xxhash_cbor(seed).hex())

mixed = list(range(16)) + [200, 256, 257, 65535, 65536, 100000] + list(range(1, 11)) + [
    1234567, 999999, 50000, 60000, 70000, 80000, 90000] + list(range(12, 21))
cases = [
    ("plain", "0", list(range(1, 17)), 16, "", (), ""),
    ("mixed widths", "0", mixed, 16, "", (), ""),
    ("default seed", "vllm-none-hash", list(range(1, 33)), 16, "", (), ""),
    ("lora", "0", list(range(1, 33)), 16, "my-lora", (), ""),
    ("salt", "0", list(range(1, 33)), 16, "", (), "salt-xyz"),
    ("all extras", "42", [0xFFFFFFFF - i for i in range(50)], 16, "adapter-1",
     (("img-a", 3, 20), ("img-b", 40, 2)), "tenant-7"),
]
for hash_fn in [sha256_cbor, xxhash_cbor]:
    print("# vLLM chains:", hash_fn.__name__)
    for name, seed, tokens, bs, lora, mm, salt in cases:
        ds = vllm_chain(hash_fn, seed, tokens, bs, lora, mm, salt)
        print(name, [d.hex() for d in ds], [key(d) for d in ds])

print("# llm-d chains")
sim_tokens = [638357778, 638357778, 399020470, 1226705564, 2382766391, 902835988, 3692005271, 2938279028,
              1294387552, 2966577424, 2530666425, 847405050, 4082650640, 2878048650, 1543540969, 2513735939,
              7, 300, 70000, 5, 24, 23, 255, 256, 65535, 65536, 0, 1, 2, 3, 4, 4294967295]
for seed, name, mm in [("", "sim-model", ()), ("42", "sim-model", ()), ("", "my-lora", ()),
                       ("", "sim-model", (("sim_img_0_1f", 5, 20), ("x", 31, 1)))]:
    root, hs = llmd_chain(seed, name, sim_tokens, 16, mm)
    print(repr(seed), name, mm, root, hs)
