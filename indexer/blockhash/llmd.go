package blockhash

// The llm-d chain, from llm-d-kv-cache pkg/kvcache/kvblock/token_processor.go:
// hash(parent, tokens, extra) marshals []interface{}{parent, tokens, extra}
// with fxamacker/cbor's CanonicalEncOptions and returns FNV-64a of the bytes.
// So a block is the array head 0x83, parent as an unsigned integer, tokens
// as an array of unsigned integers, and extra: null for a text block, else
// the block's []MMHash (extra_keys.go: struct{Hash string; Offset int64}),
// which fxamacker encodes as an array of two-entry maps keyed by the field
// names ("Hash" sorts before "Offset" by length and by bytes alike). The root
// is hash(FNV-64a(seed), nil, modelName); a nil []uint32 encodes as null.

// llmdRoot returns H(init, null, name), name being the adapter's when set.
func (h *Hasher) llmdRoot(model, lora string) uint64 {
	name := model
	if lora != "" {
		name = lora
	}
	s := fnvByte(fnvOffset64, majorArray|3)
	s = fnvHead(s, majorUint, h.init)
	s = fnvByte(s, cborNull)
	return fnvText(s, name)
}

// llmdTokens hashes the head and items of [parent, tokens, ...
func llmdTokens(parent uint64, tokens []uint32) uint64 {
	s := fnvByte(fnvOffset64, majorArray|3)
	s = fnvHead(s, majorUint, parent)
	s = fnvHead(s, majorArray, uint64(len(tokens)))
	for _, t := range tokens {
		s = fnvToken(s, t)
	}
	return s
}

// llmdBlock returns H(parent, tokens, null).
func llmdBlock(parent uint64, tokens []uint32) uint64 {
	return fnvByte(llmdTokens(parent, tokens), cborNull)
}

// llmdMMEntry hashes one MMHash{Hash: id, Offset: off} as fxamacker encodes it.
func llmdMMEntry(s uint64, id string, off int) uint64 {
	s = fnvByte(s, majorMap|2)
	s = fnvText(s, "Hash")
	s = fnvText(s, id)
	s = fnvText(s, "Offset")
	return fnvInt(s, int64(off))
}

// llmdBlockMM returns H(parent, tokens, mm) for a block with multimodal items.
func llmdBlockMM(parent uint64, tokens []uint32, mm []BlockMM) uint64 {
	s := llmdTokens(parent, tokens)
	s = fnvHead(s, majorArray, uint64(len(mm)))
	for _, m := range mm {
		s = llmdMMEntry(s, m.ID, m.Offset)
	}
	return s
}

// llmdBlockItems is llmdBlockMM for prompt items, whose offsets count from
// the prompt's start, in a block starting at token start.
func llmdBlockItems(parent uint64, tokens []uint32, items []MMItem, start int) uint64 {
	s := llmdTokens(parent, tokens)
	if len(items) == 0 {
		return fnvByte(s, cborNull)
	}
	s = fnvHead(s, majorArray, uint64(len(items)))
	for _, it := range items {
		s = llmdMMEntry(s, it.ID, it.Offset-start)
	}
	return s
}

func (h *Hasher) llmdPrompt(dst []uint64, tokens []uint32, p *Prompt) []uint64 {
	parent := h.llmdRoot(p.Model, p.LoRA)
	bs := h.cfg.BlockSize
	if len(p.MM) == 0 {
		for len(tokens) >= bs {
			parent = llmdBlock(parent, tokens[:bs])
			dst = append(dst, parent)
			tokens = tokens[bs:]
		}
		return dst
	}
	lo := 0
	for start := 0; start+bs <= len(tokens); start += bs {
		var hi int
		lo, hi = mmRange(p.MM, lo, start, start+bs)
		parent = llmdBlockItems(parent, tokens[start:start+bs], p.MM[lo:hi], start)
		dst = append(dst, parent)
	}
	return dst
}
