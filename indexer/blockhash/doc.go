// Package blockhash computes the block hash chains that key prefixd's index:
// the llm-d chain of llm-d-inference-sim and llm-d's token processor, vLLM's
// sha256_cbor and xxhash_cbor chains, and prefixd's own xxh3 chain.
//
// # Basics
//
// A prompt is cut into full blocks of BlockSize tokens (a partial last block
// is never hashed, as in every engine). Block i's hash covers its tokens and
// block i-1's hash, so equal hashes mean equal prefixes. Build a Hasher once
// per engine configuration with New and share it: its methods are safe for
// concurrent use and, given a dst with room, allocate nothing per block.
//
// The indexer uses a Hasher three ways:
//
//   - query path: AppendPrompt hashes a whole token sequence from the chain's
//     root into block keys, given model, LoRA adapter and cache salt;
//   - apply path: AppendChain re-chains a BlockStored event from its parent
//     hash and token_ids to check the engine's hashes (Root gives the parent
//     of a chain's first block, for events without a parent);
//   - Block hashes one block, with multimodal extras when the event has them.
//
// The schemes, and where each fact about them comes from:
//
//   - LLMD: H(parent, tokens, extra) = FNV-64a over the canonical CBOR of the
//     array [parent, tokens, extra]; init = FNV-64a(seed); root =
//     H(init, null, name) where name is the LoRA adapter's name when the
//     request targets one, else the served model name. Source: llm-d-kv-cache
//     pkg/kvcache/kvblock/token_processor.go (getInitHash, hash, prefixHashes)
//     and llm-d-inference-sim pkg/kv-cache/kv_cache.go (OnRequestStart passes
//     the request's model field, which names the adapter for LoRA requests).
//     Checked: every contiguous BlockStored of the shared recordings, seeds ""
//     and "42" (golden tests).
//   - VLLMSHA256CBOR: hash = SHA-256 over canonical CBOR of the array
//     [parent (32-byte string), tokens, extra_keys], parent of block 0 =
//     NONE_HASH = SHA-256(CBOR text(seed)); the published 64-bit key is the
//     digest's last 8 bytes, big-endian. Source: vLLM
//     vllm/v1/core/kv_cache_utils.py (hash_block_tokens,
//     generate_block_hash_extra_keys, init_none_hash, resolve_none_hash_seed,
//     maybe_convert_block_hash) and vllm/utils/hashing.py (sha256_cbor: cbor2
//     with canonical=True). Checked against vectors computed with Python's
//     hashlib and cbor2 5.4.6 (vectors_test.go says which).
//   - VLLMXXHashCBOR: the same chain with xxh3-128 for SHA-256
//     (vllm/utils/hashing.py xxhash_cbor: xxhash.xxh3_128_digest of the same
//     CBOR), so digests, parents included, are 16 bytes: the hash's high
//     64 bits big-endian, then its low 64 bits, which are the published key.
//     NONE_HASH = xxh3-128(CBOR text(seed)). Checked against vectors
//     computed with Python's cbor2 5.4.6 and xxhash 3.2.0, and against both
//     libraries on every test run (pycheck_test.go).
//   - XXH3: prefixd's own chain, for indexes keyed by prefixd's hashes
//     (token keys). h = xxh3-64(little-endian token bytes, seed = parent);
//     the root mixes seed, model, LoRA and cache salt.
//
// # Caveats
//
// A published vLLM key is 8 of the digest's 32 (or 16) bytes, and the next
// block is hashed from all of them: a vLLM chain cannot be continued from a
// published parent. AppendChain, Root and Block return ErrNeedsFullDigest for
// it; hash whole prompts from NONE_HASH (AppendPrompt) or carry the full
// digest along a chain (AppendDigests).
//
// vLLM's NONE_HASH seed is PYTHONHASHSEED when set. When it is unset, vLLM
// since PR #51875 (August 2026) uses VLLMDefaultSeed for sha256 and
// sha256_cbor but a random seed per process for xxhash and xxhash_cbor
// (their seed must stay secret, as they are not collision resistant), and
// older versions use 32 random bytes per process for every algorithm: such
// an engine's hashes cannot be reproduced, only keyed by token chains. An
// xxhash_cbor fleet is reproducible only with PYTHONHASHSEED set, to the
// same value on every engine.
//
// vLLM's default algorithm, sha256, and its xxhash hash pickle's bytes,
// which only CPython produces; this package does not reproduce them.
//
// The llm-d chain hashes no cache salt: llm-d's token processor and the sim
// ignore it, so this package does too. vLLM hashes it into block 0 and
// prefixd's xxh3 chain into the root.
//
// The llm-d chain is bound by FNV-64a: one multiply per CBOR byte, in one
// dependency chain, and a block of 16 sim token ids is 92 bytes. 8192 such
// tokens take about 63 µs on a 3 GHz core (55 µs for ids below 2^17).
package blockhash
