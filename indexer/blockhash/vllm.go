package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
)

// vLLM's sha256_cbor chain, from vllm/v1/core/kv_cache_utils.py and
// vllm/utils/hashing.py:
//
//	hash_block_tokens: sha256_cbor((parent or NONE_HASH, tuple(tokens), extra_keys))
//	sha256_cbor(x):    sha256(cbor2.dumps(x, canonical=True)).digest()
//	init_none_hash:    NONE_HASH = sha256_cbor(seed), seed a str
//	maybe_convert_block_hash: int.from_bytes(digest, "big") & (2**64 - 1)
//
// cbor2 writes a tuple as an array, bytes as a byte string (major 2), str as
// a text string, None as 0xf6, and with canonical=True every head in its
// shortest form. generate_block_hash_extra_keys builds extra_keys as
// tuple(lora_keys + mm_keys + cache_salt_keys + prompt_embeds_keys), or None
// when that is empty: the LoRA name on every block, (mm identifier, offset
// relative to the block) for each overlapping multimodal item, the cache salt
// on the block starting at token 0 when it is non-empty. Prompt embeddings
// are not supported here.

// Digest is a vLLM block hash: the 32-byte SHA-256 digest a chain continues.
type Digest [32]byte

// Key returns the 64-bit key vLLM publishes for d: its last 8 bytes,
// big-endian.
func (d Digest) Key() uint64 { return binary.BigEndian.Uint64(d[24:]) }

func vllmNoneHash(seed string) Digest {
	return sha256.Sum256(appendText(nil, seed))
}

// vllmBufs holds encode buffers so that hashing allocates nothing in steady
// state; a buffer grows to the largest block it has encoded.
var vllmBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// vllmEncode appends the canonical CBOR of (parent, tuple(tokens), extra_keys)
// for the block of tokens starting at prompt position start; items are the
// multimodal items overlapping it.
func vllmEncode(b []byte, parent *Digest, tokens []uint32, p *Prompt, items []MMItem, start int) []byte {
	b = append(b, majorArray|3, majorBytes|24, 32)
	b = append(b, parent[:]...)
	b = appendHead(b, majorArray, uint64(len(tokens)))
	for _, t := range tokens {
		b = appendHead(b, majorUint, uint64(t))
	}
	n := len(items)
	if p.LoRA != "" {
		n++
	}
	salt := start == 0 && p.CacheSalt != ""
	if salt {
		n++
	}
	if n == 0 {
		return append(b, cborNull)
	}
	b = appendHead(b, majorArray, uint64(n))
	if p.LoRA != "" {
		b = appendText(b, p.LoRA)
	}
	for _, it := range items {
		b = append(b, majorArray|2)
		b = appendText(b, it.ID)
		b = appendInt(b, int64(it.Offset-start))
	}
	if salt {
		b = appendText(b, p.CacheSalt)
	}
	return b
}

// vllmChain hashes the full blocks of tokens, which start at prompt position
// first, continuing parent; emit receives each digest.
func (h *Hasher) vllmChain(parent Digest, tokens []uint32, p *Prompt, first int, emit func(Digest)) {
	bp := vllmBufs.Get().(*[]byte)
	buf := (*bp)[:0]
	bs := h.cfg.BlockSize
	lo, hi := 0, 0
	for i := 0; i+bs <= len(tokens); i += bs {
		start := first + i
		if len(p.MM) > 0 {
			lo, hi = mmRange(p.MM, lo, start, start+bs)
		}
		buf = vllmEncode(buf[:0], &parent, tokens[i:i+bs], p, p.MM[lo:hi], start)
		parent = sha256.Sum256(buf)
		emit(parent)
	}
	*bp = buf[:0]
	vllmBufs.Put(bp)
}

func (h *Hasher) vllmPrompt(dst []uint64, tokens []uint32, p *Prompt) []uint64 {
	h.vllmChain(h.none, tokens, p, 0, func(d Digest) { dst = append(dst, d.Key()) })
	return dst
}

// NoneHash returns vLLM's NONE_HASH for h's seed: the parent of a chain's
// first block. It is the zero Digest for other schemes.
func (h *Hasher) NoneHash() Digest { return h.none }

// AppendDigests appends the 32-byte digests of the full blocks of tokens,
// continuing parent (NoneHash for a prompt's first block), and returns the
// extended dst. first is the prompt position of tokens[0], a multiple of
// the block size: it places the cache salt (block 0 only) and p.MM, whose
// offsets count from the prompt's start. Only VLLMSHA256CBOR has digests
// (ErrWrongScheme otherwise).
func (h *Hasher) AppendDigests(dst []Digest, parent Digest, tokens []uint32, p Prompt, first int) ([]Digest, error) {
	if h.cfg.Scheme != VLLMSHA256CBOR {
		return dst, fmt.Errorf("%w: AppendDigests is for %v, not %v", ErrWrongScheme, VLLMSHA256CBOR, h.cfg.Scheme)
	}
	if first < 0 || first%h.cfg.BlockSize != 0 {
		return dst, fmt.Errorf("first token %d is not a block boundary (block size %d)", first, h.cfg.BlockSize)
	}
	if err := checkMM(p.MM); err != nil {
		return dst, err
	}
	h.vllmChain(parent, tokens, &p, first, func(d Digest) { dst = append(dst, d) })
	return dst, nil
}
