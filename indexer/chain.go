package indexer

import (
	"errors"

	"github.com/prefixd/prefixd/indexer/blockhash"
)

// newHashers returns a model's engine hasher (the configured scheme) and its
// own hasher (XXH3 with the same seed and block size, for tokens mode).
func newHashers(o ModelOptions) (engine, own *blockhash.Hasher, err error) {
	scheme, err := blockhash.ParseScheme(o.HashScheme)
	if err != nil {
		return nil, nil, err
	}
	engine, err = blockhash.New(blockhash.Config{Scheme: scheme, Seed: o.HashSeed, BlockSize: o.BlockSize})
	if err != nil {
		return nil, nil, err
	}
	own, err = blockhash.New(blockhash.Config{Scheme: blockhash.XXH3, Seed: o.HashSeed, BlockSize: o.BlockSize})
	return engine, own, err
}

// prompt appends the keys of a whole prompt's full blocks.
func prompt(h *blockhash.Hasher, dst []uint64, tokens []uint32, p blockhash.Prompt) []uint64 {
	keys, err := h.AppendPrompt(dst, tokens, p)
	if err != nil {
		// Only multimodal items can make AppendPrompt fail, and the
		// indexer passes none.
		panic("indexer: " + err.Error())
	}
	return keys
}

// rechain appends the keys of blocks continuing a published parent; ok is
// false when the scheme cannot continue from a 64-bit key.
func rechain(h *blockhash.Hasher, dst []uint64, parent uint64, tokens []uint32) (keys []uint64, ok bool) {
	keys, err := h.AppendChain(dst, parent, tokens)
	if errors.Is(err, blockhash.ErrNeedsFullDigest) {
		return dst, false
	}
	return keys, err == nil
}
