package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/zeebo/xxh3"
)

// vLLM's CBOR chains, sha256_cbor and xxhash_cbor, from
// vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py:
//
//	hash_block_tokens: hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))
//	sha256_cbor(x):    hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
//	xxhash_cbor(x):    xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))
//	init_none_hash:    NONE_HASH = hash_fn(seed), seed a str
//	maybe_convert_block_hash: int.from_bytes(digest, "big") & (2**64 - 1)
//
// The two differ only in hash_fn: a 32-byte SHA-256 digest, or the 16-byte
// canonical xxh3-128 digest (the high 64 bits big-endian, then the low 64
// bits, so the published key is the low half). The parent a block's CBOR
// embeds is the previous digest, 32 or 16 bytes.
//
// cbor2 writes a tuple as an array, bytes as a byte string (major 2), str as
// a text string, None as 0xf6, and with canonical=True every head in its
// shortest form. generate_block_hash_extra_keys builds extra_keys as
// tuple(lora_keys + mm_keys + cache_salt_keys + prompt_embeds_keys), or None
// when that is empty: the LoRA name on every block, (mm identifier, offset
// relative to the block) for each overlapping multimodal item, the cache salt
// on the block starting at token 0 when it is non-empty. Prompt embeddings
// are not supported here.

// Digest is a vLLM block hash as its chain continues it: 32 bytes for
// VLLMSHA256CBOR, 16 for VLLMXXHashCBOR. The zero Digest has no bytes and
// continues no chain. Digests compare with ==.
type Digest struct {
	b [32]byte // b[:n] is the digest, the rest zero
	n uint8
}

// ParseDigest returns b, a vLLM block hash of 32 (sha256_cbor) or 16
// (xxhash_cbor) bytes, as a Digest. Engines publish such bytes when
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
func ParseDigest(b []byte) (Digest, error) {
	var d Digest
	if len(b) != 32 && len(b) != 16 {
		return d, fmt.Errorf("%w: want 32 or 16 bytes; have %d", ErrDigestSize, len(b))
	}
	d.n = uint8(copy(d.b[:], b))
	return d, nil
}

// Len returns the digest's length in bytes: 32, 16, or 0 for the zero Digest.
func (d Digest) Len() int { return int(d.n) }

// Bytes returns a copy of the digest's bytes.
func (d Digest) Bytes() []byte { return append([]byte(nil), d.b[:d.n]...) }

// String returns the digest in hex.
func (d Digest) String() string { return hex.EncodeToString(d.b[:d.n]) }

// Key returns the 64-bit key vLLM publishes for d: its last 8 bytes,
// big-endian (0 for the zero Digest).
func (d Digest) Key() uint64 {
	if d.n < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(d.b[d.n-8 : d.n])
}

// digestSize returns the length of scheme s's digests: 32 or 16 for vLLM's
// chains, 0 for the 64-bit ones.
func digestSize(s Scheme) int {
	switch s {
	case VLLMSHA256CBOR:
		return 32
	case VLLMXXHashCBOR:
		return 16
	}
	return 0
}

// vllmSum returns vLLM scheme s's digest of b, a CBOR encoding.
func vllmSum(s Scheme, b []byte) Digest {
	var d Digest
	if s == VLLMXXHashCBOR {
		// xxh3_128_digest: XXH128_canonicalFromHash, high half first.
		u := xxh3.Hash128(b)
		binary.BigEndian.PutUint64(d.b[0:8], u.Hi)
		binary.BigEndian.PutUint64(d.b[8:16], u.Lo)
		d.n = 16
		return d
	}
	d.b, d.n = sha256.Sum256(b), 32
	return d
}

// vllmNoneHash returns NONE_HASH: the digest of the seed's CBOR text string.
func vllmNoneHash(s Scheme, seed string) Digest {
	return vllmSum(s, appendText(nil, seed))
}

// vllmBufs holds encode buffers so that hashing allocates nothing in steady
// state; a buffer grows to the largest block it has encoded.
var vllmBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// vllmEncode appends the canonical CBOR of (parent, tuple(tokens), extra_keys)
// for the block of tokens starting at prompt position start; items are the
// multimodal items overlapping it.
func vllmEncode(b []byte, parent *Digest, tokens []uint32, p *Prompt, items []MMItem, start int) []byte {
	b = append(b, majorArray|3)
	b = appendHead(b, majorBytes, uint64(parent.n))
	b = append(b, parent.b[:parent.n]...)
	b = appendHead(b, majorArray, uint64(len(tokens)))
	b = appendTokens(b, tokens)
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
		parent = vllmSum(h.cfg.Scheme, buf)
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
// first block. It is the zero Digest for the schemes that are not vLLM's.
func (h *Hasher) NoneHash() Digest { return h.none }

// AppendDigests appends the digests of the full blocks of tokens, continuing
// parent (NoneHash for a prompt's first block), and returns the extended
// dst. first is the prompt position of tokens[0], a multiple of the block
// size: it places the cache salt (block 0 only) and p.MM, whose offsets
// count from the prompt's start. Only vLLM's schemes have digests
// (ErrWrongScheme otherwise), and parent must be one of h's scheme
// (ErrDigestSize otherwise).
func (h *Hasher) AppendDigests(dst []Digest, parent Digest, tokens []uint32, p Prompt, first int) ([]Digest, error) {
	size := digestSize(h.cfg.Scheme)
	if size == 0 {
		return dst, fmt.Errorf("%w: AppendDigests is for %v and %v, not %v", ErrWrongScheme, VLLMSHA256CBOR, VLLMXXHashCBOR, h.cfg.Scheme)
	}
	if parent.Len() != size {
		return dst, fmt.Errorf("%w: %v continues %d-byte digests; the parent has %d bytes", ErrDigestSize, h.cfg.Scheme, size, parent.Len())
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
