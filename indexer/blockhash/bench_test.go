package blockhash

import "testing"

// BenchmarkChain hashes a prompt of 8192 tokens into 512 blocks of 16 from
// the chain's root: the query path. Token ids are sim-like (FNV-32 values,
// nearly all wider than 16 bits, five CBOR bytes each); the -vocab runs use
// ids below 2^17, as a real tokenizer's are, which encode shorter.
func BenchmarkChain(b *testing.B) {
	sim := randTokensSeeded(8192)
	vocab := make([]uint32, len(sim))
	for i, t := range sim {
		vocab[i] = t % 131072
	}
	for _, c := range []struct {
		name   string
		scheme Scheme
		tokens []uint32
	}{
		{"llmd-512x16", LLMD, sim},
		{"llmd-vocab-512x16", LLMD, vocab},
		{"xxh3-512x16", XXH3, sim},
		{"vllm-sha256-cbor-512x16", VLLMSHA256CBOR, sim},
		{"vllm-sha256-cbor-vocab-512x16", VLLMSHA256CBOR, vocab},
		{"vllm-xxhash-cbor-512x16", VLLMXXHashCBOR, sim},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := mustNew(b, c.scheme, "", 16)
			p := Prompt{Model: "sim-model"}
			dst := make([]uint64, 0, 512)
			b.ReportAllocs()
			b.SetBytes(int64(len(c.tokens) * 4))
			for b.Loop() {
				dst, _ = h.AppendPrompt(dst[:0], c.tokens, p)
			}
			if len(dst) != 512 {
				b.Fatalf("%d keys", len(dst))
			}
		})
	}
}

// BenchmarkRechain re-chains one BlockStored event of 16 blocks from its
// parent: the apply path.
func BenchmarkRechain(b *testing.B) {
	tokens := randTokensSeeded(256)
	for _, s := range []Scheme{LLMD, XXH3} {
		b.Run(s.String()+"-16x16", func(b *testing.B) {
			h := mustNew(b, s, "", 16)
			dst := make([]uint64, 0, 16)
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = h.AppendChain(dst[:0], 12345, tokens)
			}
		})
	}
}

// BenchmarkFNV64aFloor runs bare FNV-64a over as many bytes as the llm-d
// chain's canonical CBOR of 512 blocks of 16 sim token ids (92 bytes a
// block: array and parent heads, 16 five-byte token ids, null), fed four
// bytes at a time from a word as fnvWord does, with no encoding at all.
// Every byte's multiply waits for the previous byte's, so no implementation
// of that chain can be faster than this on the same CPU: it is the floor
// BenchmarkChain/llmd-512x16 is measured against.
func BenchmarkFNV64aFloor(b *testing.B) {
	words := make([]uint32, 512*92/4)
	for i := range words {
		words[i] = uint32(i) * 2654435761
	}
	b.SetBytes(int64(4 * len(words)))
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		h := fnvOffset64
		for _, w := range words {
			h = fnvWord(h, w)
		}
		sink += h
	}
	if sink == 1 {
		b.Log(sink)
	}
}
