package blockhash

import (
	"errors"
	"fmt"
)

// Scheme names a block hash chain.
type Scheme uint8

const (
	// LLMD is the llm-d chain: FNV-64a over canonical CBOR, rooted in the
	// model (or LoRA adapter) name. llm-d-inference-sim and llm-d's token
	// processor publish it.
	LLMD Scheme = iota + 1
	// VLLMSHA256CBOR is vLLM's --prefix-caching-hash-algo sha256_cbor:
	// SHA-256 over canonical CBOR, 32-byte digests.
	VLLMSHA256CBOR
	// XXH3 is prefixd's own chain over token ids.
	XXH3
	// VLLMXXHashCBOR is vLLM's --prefix-caching-hash-algo xxhash_cbor:
	// xxh3-128 over the same canonical CBOR, 16-byte digests.
	VLLMXXHashCBOR
)

var schemeNames = [...]string{LLMD: "llmd", VLLMSHA256CBOR: "vllm-sha256-cbor", XXH3: "xxh3", VLLMXXHashCBOR: "vllm-xxhash-cbor"}

// SchemeNames lists the names ParseScheme accepts, separated by "|".
const SchemeNames = "llmd|vllm-sha256-cbor|vllm-xxhash-cbor|xxh3"

func (s Scheme) String() string {
	if s > 0 && int(s) < len(schemeNames) {
		return schemeNames[s]
	}
	return fmt.Sprintf("Scheme(%d)", uint8(s))
}

// ParseScheme parses a scheme name: llmd, vllm-sha256-cbor,
// vllm-xxhash-cbor or xxh3.
func ParseScheme(name string) (Scheme, error) {
	for s, n := range schemeNames {
		if n != "" && n == name {
			return Scheme(s), nil
		}
	}
	return 0, fmt.Errorf("%w %q: want one of %s", ErrUnknownScheme, name, SchemeNames)
}

// VLLMDefaultSeed is the seed vLLM derives NONE_HASH from when PYTHONHASHSEED
// is unset and the hash is sha256 or sha256_cbor (DEFAULT_NONE_HASH_SEED in
// vllm/v1/core/kv_cache_utils.py, since PR #51875). Older vLLM used random
// bytes instead. It never applies to xxhash_cbor: see DefaultSeed.
const VLLMDefaultSeed = "vllm-none-hash"

// DefaultSeed returns the seed an engine of scheme hashes with when it is
// given none: VLLMDefaultSeed for vLLM's sha256_cbor, "" otherwise. vLLM's
// xxhash_cbor has no such seed: without PYTHONHASHSEED every engine process
// draws a random one (resolve_none_hash_seed: xxhash is not collision
// resistant, so its seed must stay secret), whose hashes cannot be
// reproduced. "" reproduces only engines started with PYTHONHASHSEED="".
func DefaultSeed(s Scheme) string {
	if s == VLLMSHA256CBOR {
		return VLLMDefaultSeed
	}
	return ""
}

// MaxBlockSize bounds Config.BlockSize. Engines use 16 to 256.
const MaxBlockSize = 1 << 16

// Errors returned by this package.
var (
	// ErrUnknownScheme: a scheme name or value this package does not know.
	ErrUnknownScheme = errors.New("unknown hash scheme")
	// ErrBlockSize: a block size out of 1..MaxBlockSize.
	ErrBlockSize = errors.New("invalid block size")
	// ErrNeedsFullDigest: the operation needs a 64-bit chain, and vLLM's
	// chains continue from 32- or 16-byte digests, of which events publish
	// 8 bytes.
	ErrNeedsFullDigest = errors.New("vLLM chains continue from full digests (32 or 16 bytes), not published 64-bit keys")
	// ErrDigestSize: a digest of a length the scheme does not have.
	ErrDigestSize = errors.New("wrong digest size")
	// ErrMultimodal: multimodal items that are out of order, overlap, or
	// have a negative offset or a non-positive length.
	ErrMultimodal = errors.New("invalid multimodal items")
	// ErrWrongScheme: a scheme-specific operation called on another scheme.
	ErrWrongScheme = errors.New("operation not defined for this hash scheme")
)

// Config says which chain a Hasher computes.
type Config struct {
	Scheme Scheme
	// Seed is the engine's hash seed: llm-d-inference-sim's --hash-seed (or
	// its PYTHONHASHSEED), vLLM's PYTHONHASHSEED (for sha256_cbor
	// VLLMDefaultSeed when unset; see DefaultSeed), or any string for XXH3.
	// "" is a seed like any other.
	Seed string
	// BlockSize is the engine's tokens per block, 1..MaxBlockSize.
	BlockSize int
}

// Prompt carries what besides token ids goes into a prompt's hashes.
type Prompt struct {
	// Model is the served model name.
	Model string
	// LoRA is the adapter's name when the request targets one. The llm-d
	// chain roots in it instead of Model; vLLM hashes it into every block.
	LoRA string
	// CacheSalt is the request's cache_salt: vLLM hashes it into block 0,
	// XXH3 into the root, and the llm-d chain ignores it as llm-d does.
	CacheSalt string
	// MM lists multimodal items by token position, in increasing Offset,
	// not overlapping. Each block that overlaps an item carries the item's
	// identifier and its offset relative to the block's first token.
	MM []MMItem
}

// MMItem is one multimodal input: its identifier (vLLM's mm_hash, llm-d's
// MMHash.Hash) and the token positions of its placeholder in the prompt.
type MMItem struct {
	ID     string
	Offset int
	Length int
}

// BlockMM is one multimodal item as a block's hash sees it: its identifier
// and its first token's position relative to the block's first token,
// negative when the item began in an earlier block.
type BlockMM struct {
	ID     string
	Offset int
}

// Hasher computes one configured chain. It is immutable after New and safe
// for concurrent use. It is built for the query and event apply paths:
// thousands of prompts per second, each up to tens of thousands of tokens.
type Hasher struct {
	cfg Config
	// init is FNV-64a(seed) for LLMD, xxh3(seed) for XXH3.
	init uint64
	// none is vLLM's NONE_HASH for VLLMSHA256CBOR and VLLMXXHashCBOR.
	none Digest
}

// New validates cfg and returns its Hasher.
func New(cfg Config) (*Hasher, error) {
	if cfg.BlockSize < 1 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("%w %d: want 1..%d tokens", ErrBlockSize, cfg.BlockSize, MaxBlockSize)
	}
	h := &Hasher{cfg: cfg}
	switch cfg.Scheme {
	case LLMD:
		h.init = fnvString(fnvOffset64, cfg.Seed)
	case VLLMSHA256CBOR, VLLMXXHashCBOR:
		h.none = vllmNoneHash(cfg.Scheme, cfg.Seed)
	case XXH3:
		h.init = xxh3Init(cfg.Seed)
	default:
		return nil, fmt.Errorf("%w: %v", ErrUnknownScheme, cfg.Scheme)
	}
	return h, nil
}

// Config returns the configuration h was built from.
func (h *Hasher) Config() Config { return h.cfg }

// BlockSize returns the tokens per block.
func (h *Hasher) BlockSize() int { return h.cfg.BlockSize }

// String describes h for logs, e.g. "llmd seed=\"42\" block=16".
func (h *Hasher) String() string {
	return fmt.Sprintf("%v seed=%q block=%d", h.cfg.Scheme, h.cfg.Seed, h.cfg.BlockSize)
}

// AppendPrompt appends the keys of the full blocks of tokens, hashed from the
// chain's start with p's model, adapter, salt and multimodal items, and
// returns the extended dst. The error is ErrMultimodal for bad p.MM; with a
// dst of enough capacity nothing is allocated.
func (h *Hasher) AppendPrompt(dst []uint64, tokens []uint32, p Prompt) ([]uint64, error) {
	if err := checkMM(p.MM); err != nil {
		return dst, err
	}
	switch h.cfg.Scheme {
	case LLMD:
		return h.llmdPrompt(dst, tokens, &p), nil
	case VLLMSHA256CBOR, VLLMXXHashCBOR:
		return h.vllmPrompt(dst, tokens, &p), nil
	default:
		return h.xxh3Prompt(dst, tokens, &p), nil
	}
}

// Root returns the hash a chain's first block continues: for LLMD the
// model's (or adapter's) root, for XXH3 the root of model, adapter and salt.
// It is what an event's missing parent stands for. vLLM's schemes have no
// 64-bit root (ErrNeedsFullDigest): see NoneHash.
func (h *Hasher) Root(model, lora, cacheSalt string) (uint64, error) {
	switch h.cfg.Scheme {
	case LLMD:
		return h.llmdRoot(model, lora), nil
	case XXH3:
		return h.xxh3Root(model, lora, cacheSalt), nil
	default:
		return 0, ErrNeedsFullDigest
	}
}

// AppendChain appends the keys of the full blocks of tokens chained from
// parent, a published block hash or a Root, and returns the extended dst.
// This re-chains a BlockStored event from its parent and token_ids. It
// allocates nothing given capacity; vLLM's schemes return
// ErrNeedsFullDigest.
func (h *Hasher) AppendChain(dst []uint64, parent uint64, tokens []uint32) ([]uint64, error) {
	bs := h.cfg.BlockSize
	switch h.cfg.Scheme {
	case LLMD:
		for len(tokens) >= bs {
			parent = llmdBlock(parent, tokens[:bs])
			dst = append(dst, parent)
			tokens = tokens[bs:]
		}
		return dst, nil
	case XXH3:
		for len(tokens) >= bs {
			parent = xxh3Block(parent, tokens[:bs], 0)
			dst = append(dst, parent)
			tokens = tokens[bs:]
		}
		return dst, nil
	default:
		return dst, ErrNeedsFullDigest
	}
}

// Block returns the hash of one block of tokens (any length) continuing
// parent, with the block's multimodal items (nil for none). vLLM's schemes
// return ErrNeedsFullDigest.
func (h *Hasher) Block(parent uint64, tokens []uint32, mm []BlockMM) (uint64, error) {
	switch h.cfg.Scheme {
	case LLMD:
		if len(mm) == 0 {
			return llmdBlock(parent, tokens), nil
		}
		return llmdBlockMM(parent, tokens, mm), nil
	case XXH3:
		return xxh3Block(parent, tokens, xxh3MM(mm)), nil
	default:
		return 0, ErrNeedsFullDigest
	}
}
