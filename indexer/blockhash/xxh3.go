package blockhash

import (
	"unsafe"

	"github.com/zeebo/xxh3"
)

// prefixd's own chain. A block's hash is xxh3-64 of its token ids as
// little-endian uint32s, seeded with the parent hash (xor the block's
// multimodal extras, when it has some). The root chains the seed, model,
// LoRA adapter and cache salt through xxh3 with distinct tweaks, so that
// each changes every key of a prompt.

// Tweaks keep the root's inputs apart; they are arbitrary odd constants.
const (
	xxh3TweakSeed  uint64 = 0x7072656669786431 // "prefixd1"
	xxh3TweakLoRA  uint64 = 0x9e3779b97f4a7c15
	xxh3TweakSalt  uint64 = 0xc2b2ae3d27d4eb4f
	xxh3TweakMM    uint64 = 0x165667b19e3779f9
	xxh3TweakMMOff uint64 = 0x27d4eb2f165667c5
)

func xxh3Init(seed string) uint64 { return xxh3.HashStringSeed(seed, xxh3TweakSeed) }

func (h *Hasher) xxh3Root(model, lora, salt string) uint64 {
	r := xxh3.HashStringSeed(model, h.init)
	r = xxh3.HashStringSeed(lora, r^xxh3TweakLoRA)
	if salt != "" {
		r = xxh3.HashStringSeed(salt, r^xxh3TweakSalt)
	}
	return r
}

// littleEndian reports whether token ids can be hashed in place.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// xxh3Block returns xxh3(tokens as little-endian bytes, seed parent^extra).
func xxh3Block(parent uint64, tokens []uint32, extra uint64) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, parent^extra)
	}
	if littleEndian {
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), len(tokens)*4)
		return xxh3.HashSeed(b, parent^extra)
	}
	// Big-endian hosts copy, so that keys are the same on every host.
	b := make([]byte, 0, len(tokens)*4)
	for _, t := range tokens {
		b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return xxh3.HashSeed(b, parent^extra)
}

// xxh3MMStep folds one multimodal item into a block's extra.
func xxh3MMStep(m uint64, id string, off int) uint64 {
	return xxh3.HashStringSeed(id, m^(uint64(int64(off))*xxh3TweakMMOff))
}

// xxh3MM returns a block's multimodal extra: 0 for none.
func xxh3MM(mm []BlockMM) uint64 {
	if len(mm) == 0 {
		return 0
	}
	m := xxh3TweakMM
	for _, it := range mm {
		m = xxh3MMStep(m, it.ID, it.Offset)
	}
	return m
}

// xxh3Items is xxh3MM for prompt items in a block starting at token start.
func xxh3Items(items []MMItem, start int) uint64 {
	if len(items) == 0 {
		return 0
	}
	m := xxh3TweakMM
	for _, it := range items {
		m = xxh3MMStep(m, it.ID, it.Offset-start)
	}
	return m
}

func (h *Hasher) xxh3Prompt(dst []uint64, tokens []uint32, p *Prompt) []uint64 {
	parent := h.xxh3Root(p.Model, p.LoRA, p.CacheSalt)
	bs := h.cfg.BlockSize
	lo, hi := 0, 0
	for start := 0; start+bs <= len(tokens); start += bs {
		var extra uint64
		if len(p.MM) > 0 {
			lo, hi = mmRange(p.MM, lo, start, start+bs)
			extra = xxh3Items(p.MM[lo:hi], start)
		}
		parent = xxh3Block(parent, tokens[start:start+bs], extra)
		dst = append(dst, parent)
	}
	return dst
}
