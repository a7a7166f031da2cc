package blockhash

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
)

// allSchemes and vllmSchemes list the schemes the tests run over.
var (
	allSchemes  = []Scheme{LLMD, VLLMSHA256CBOR, VLLMXXHashCBOR, XXH3}
	vllmSchemes = []Scheme{VLLMSHA256CBOR, VLLMXXHashCBOR}
)

func mustNew(t testing.TB, s Scheme, seed string, bs int) *Hasher {
	t.Helper()
	h, err := New(Config{Scheme: s, Seed: seed, BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestParseScheme(t *testing.T) {
	for _, s := range allSchemes {
		got, err := ParseScheme(s.String())
		if err != nil || got != s {
			t.Errorf("ParseScheme(%q) = %v, %v", s.String(), got, err)
		}
		if !strings.Contains("|"+SchemeNames+"|", "|"+s.String()+"|") {
			t.Errorf("SchemeNames %q lacks %v", SchemeNames, s)
		}
	}
	if n := strings.Count(SchemeNames, "|") + 1; n != len(allSchemes) {
		t.Errorf("SchemeNames %q names %d schemes, want %d", SchemeNames, n, len(allSchemes))
	}
	for _, bad := range []string{"", "LLMD", "sha256_cbor", "xxhash_cbor", "vllm-xxhash", "vllm"} {
		if _, err := ParseScheme(bad); !errors.Is(err, ErrUnknownScheme) {
			t.Errorf("ParseScheme(%q): %v, want ErrUnknownScheme", bad, err)
		}
	}
	if got := Scheme(9).String(); got != "Scheme(9)" {
		t.Errorf("unknown scheme prints %q", got)
	}
}

func TestDefaultSeed(t *testing.T) {
	for s, want := range map[Scheme]string{LLMD: "", VLLMSHA256CBOR: VLLMDefaultSeed, VLLMXXHashCBOR: "", XXH3: ""} {
		if got := DefaultSeed(s); got != want {
			t.Errorf("DefaultSeed(%v) = %q, want %q", s, got, want)
		}
	}
}

func TestDigest(t *testing.T) {
	for _, n := range []int{32, 16} {
		raw := make([]byte, n)
		for i := range raw {
			raw[i] = byte(i + 1)
		}
		d, err := ParseDigest(raw)
		if err != nil || d.Len() != n || !slices.Equal(d.Bytes(), raw) || d.String() != hex.EncodeToString(raw) {
			t.Fatalf("ParseDigest(%d bytes) = %v (%d bytes), %v", n, d, d.Len(), err)
		}
		// The published key is the last 8 bytes, big-endian.
		if want := binary.BigEndian.Uint64(raw[n-8:]); d.Key() != want {
			t.Errorf("%d bytes: Key %#x, want %#x", n, d.Key(), want)
		}
	}
	for _, n := range []int{0, 8, 20, 33} {
		if _, err := ParseDigest(make([]byte, n)); !errors.Is(err, ErrDigestSize) {
			t.Errorf("ParseDigest(%d bytes): %v, want ErrDigestSize", n, err)
		}
	}
	if d := (Digest{}); d.Len() != 0 || d.Key() != 0 || d.String() != "" {
		t.Errorf("zero Digest: %d bytes, key %d, %q", d.Len(), d.Key(), d)
	}
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want error
	}{
		{Config{Scheme: LLMD, BlockSize: 0}, ErrBlockSize},
		{Config{Scheme: LLMD, BlockSize: -16}, ErrBlockSize},
		{Config{Scheme: XXH3, BlockSize: MaxBlockSize + 1}, ErrBlockSize},
		{Config{Scheme: 0, BlockSize: 16}, ErrUnknownScheme},
		{Config{Scheme: 42, BlockSize: 16}, ErrUnknownScheme},
	} {
		if _, err := New(c.cfg); !errors.Is(err, c.want) {
			t.Errorf("New(%+v) = %v, want %v", c.cfg, err, c.want)
		}
	}
	h := mustNew(t, VLLMSHA256CBOR, "7", 32)
	if h.BlockSize() != 32 || h.Config().Seed != "7" || h.String() != `vllm-sha256-cbor seed="7" block=32` {
		t.Errorf("accessors: %d %+v %s", h.BlockSize(), h.Config(), h)
	}
	if h := mustNew(t, VLLMXXHashCBOR, "7", 16); h.String() != `vllm-xxhash-cbor seed="7" block=16` || h.NoneHash().Len() != 16 {
		t.Errorf("accessors: %s, NONE_HASH %v", h, h.NoneHash())
	}
}

func TestPartialBlocksAreNotHashed(t *testing.T) {
	for _, s := range allSchemes {
		h := mustNew(t, s, "", 16)
		for n, want := range map[int]int{0: 0, 15: 0, 16: 1, 31: 1, 32: 2, 47: 2} {
			keys, err := h.AppendPrompt(nil, seq(1, n), Prompt{Model: "m"})
			if err != nil || len(keys) != want {
				t.Errorf("%v: %d tokens gave %d keys, %v; want %d", s, n, len(keys), err, want)
			}
		}
	}
}

// TestChainsAgree checks that AppendChain and Block, from Root, give what
// AppendPrompt gives, and that keys are prefix-stable.
func TestChainsAgree(t *testing.T) {
	tokens := randTokensSeeded(100)
	for _, s := range []Scheme{LLMD, XXH3} {
		h := mustNew(t, s, "s", 16)
		p := Prompt{Model: "m", LoRA: "l", CacheSalt: "c"}
		want, err := h.AppendPrompt(nil, tokens, p)
		if err != nil {
			t.Fatal(err)
		}
		root, err := h.Root(p.Model, p.LoRA, p.CacheSalt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.AppendChain(nil, root, tokens)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%v: AppendChain from root = %v, %v; want %v", s, got, err, want)
		}
		// Re-chaining the tail from a published key, as for a BlockStored.
		tail, err := h.AppendChain(nil, want[2], tokens[48:])
		if err != nil || !slices.Equal(tail, want[3:]) {
			t.Errorf("%v: AppendChain from key 2 = %v; want %v", s, tail, want[3:])
		}
		b, err := h.Block(want[0], tokens[16:32], nil)
		if err != nil || b != want[1] {
			t.Errorf("%v: Block = %d, %v; want %d", s, b, err, want[1])
		}
		short, _ := h.AppendPrompt(nil, tokens[:40], p)
		if !slices.Equal(short, want[:2]) {
			t.Errorf("%v: keys of a prefix are not a prefix of the keys", s)
		}
	}
}

// TestMultimodalBlocksAgree checks that Block with per-block items gives the
// keys AppendPrompt assigns from prompt positions.
func TestMultimodalBlocksAgree(t *testing.T) {
	tokens := randTokensSeeded(64)
	mm := []MMItem{{ID: "a", Offset: 3, Length: 20}, {ID: "b", Offset: 23, Length: 1}, {ID: "c", Offset: 40, Length: 24}}
	perBlock := [][]BlockMM{
		{{"a", 3}},
		{{"a", -13}, {"b", 7}},
		{{"c", 8}},
		{{"c", -8}},
	}
	for _, s := range []Scheme{LLMD, XXH3} {
		h := mustNew(t, s, "", 16)
		want, err := h.AppendPrompt(nil, tokens, Prompt{Model: "m", MM: mm})
		if err != nil {
			t.Fatal(err)
		}
		plain, _ := h.AppendPrompt(nil, tokens, Prompt{Model: "m"})
		parent, _ := h.Root("m", "", "")
		for i, bm := range perBlock {
			got, err := h.Block(parent, tokens[16*i:16*i+16], bm)
			if err != nil || got != want[i] {
				t.Fatalf("%v block %d: %d, %v; want %d", s, i, got, err, want[i])
			}
			if want[i] == plain[i] {
				t.Errorf("%v block %d: multimodal items did not change the key", s, i)
			}
			parent = got
		}
	}
}

func TestBadMultimodalItems(t *testing.T) {
	for _, mm := range [][]MMItem{
		{{ID: "a", Offset: -1, Length: 2}},
		{{ID: "a", Offset: 0, Length: 0}},
		{{ID: "a", Offset: 5, Length: 4}, {ID: "b", Offset: 8, Length: 1}},
		{{ID: "a", Offset: 9, Length: 1}, {ID: "b", Offset: 2, Length: 1}},
	} {
		for _, s := range allSchemes {
			h := mustNew(t, s, "", 16)
			if _, err := h.AppendPrompt(nil, seq(0, 32), Prompt{MM: mm}); !errors.Is(err, ErrMultimodal) {
				t.Errorf("%v %+v: %v, want ErrMultimodal", s, mm, err)
			}
		}
	}
	for _, s := range vllmSchemes {
		h := mustNew(t, s, "", 16)
		if _, err := h.AppendDigests(nil, h.NoneHash(), seq(0, 32), Prompt{MM: []MMItem{{Length: -1}}}, 0); !errors.Is(err, ErrMultimodal) {
			t.Errorf("%v AppendDigests with bad items: %v", s, err)
		}
	}
}

func TestVLLMNeedsFullDigests(t *testing.T) {
	for _, s := range vllmSchemes {
		h := mustNew(t, s, "", 16)
		if _, err := h.Root("m", "", ""); !errors.Is(err, ErrNeedsFullDigest) {
			t.Errorf("%v Root: %v", s, err)
		}
		if _, err := h.AppendChain(nil, 1, seq(0, 16)); !errors.Is(err, ErrNeedsFullDigest) {
			t.Errorf("%v AppendChain: %v", s, err)
		}
		if _, err := h.Block(1, seq(0, 16), nil); !errors.Is(err, ErrNeedsFullDigest) {
			t.Errorf("%v Block: %v", s, err)
		}
		if _, err := h.AppendDigests(nil, h.NoneHash(), seq(0, 32), Prompt{}, 8); err == nil {
			t.Errorf("%v AppendDigests from a position inside a block: no error", s)
		}
	}
	// Each vLLM scheme continues only its own digests.
	sha, xx := mustNew(t, VLLMSHA256CBOR, "", 16), mustNew(t, VLLMXXHashCBOR, "", 16)
	for _, c := range []struct {
		h      *Hasher
		parent Digest
	}{{sha, xx.NoneHash()}, {xx, sha.NoneHash()}, {sha, Digest{}}, {xx, Digest{}}} {
		if _, err := c.h.AppendDigests(nil, c.parent, seq(0, 16), Prompt{}, 0); !errors.Is(err, ErrDigestSize) {
			t.Errorf("%v from a %d-byte parent: %v, want ErrDigestSize", c.h.Config().Scheme, c.parent.Len(), err)
		}
	}
	for _, s := range []Scheme{LLMD, XXH3} {
		o := mustNew(t, s, "", 16)
		if _, err := o.AppendDigests(nil, Digest{}, seq(0, 16), Prompt{}, 0); !errors.Is(err, ErrWrongScheme) {
			t.Errorf("%v AppendDigests: %v", s, err)
		}
		if o.NoneHash() != (Digest{}) {
			t.Errorf("%v NoneHash is not zero", s)
		}
	}
}

// TestInputsChangeKeys checks which inputs each scheme hashes.
func TestInputsChangeKeys(t *testing.T) {
	tokens := randTokensSeeded(32)
	base := Prompt{Model: "m"}
	variants := map[string]Prompt{
		"model": {Model: "m2"},
		"lora":  {Model: "m", LoRA: "l"},
		"salt":  {Model: "m", CacheSalt: "s"},
	}
	hashes := map[Scheme]map[string]bool{ // whether the input changes keys
		LLMD:           {"model": true, "lora": true, "salt": false, "seed": true},
		VLLMSHA256CBOR: {"model": false, "lora": true, "salt": true, "seed": true},
		VLLMXXHashCBOR: {"model": false, "lora": true, "salt": true, "seed": true},
		XXH3:           {"model": true, "lora": true, "salt": true, "seed": true},
	}
	for s, want := range hashes {
		h := mustNew(t, s, "", 16)
		ref, _ := h.AppendPrompt(nil, tokens, base)
		for name, p := range variants {
			got, _ := h.AppendPrompt(nil, tokens, p)
			if changed := !slices.Equal(got, ref); changed != want[name] {
				t.Errorf("%v: %s changes keys: %v, want %v", s, name, changed, want[name])
			}
			if want[name] && got[1] == ref[1] {
				t.Errorf("%v: %s changes block 0 only", s, name)
			}
		}
		other, _ := mustNew(t, s, "other", 16).AppendPrompt(nil, tokens, base)
		if slices.Equal(other, ref) != !want["seed"] {
			t.Errorf("%v: seed changes keys: %v", s, !slices.Equal(other, ref))
		}
	}
}

func TestNoAllocations(t *testing.T) {
	tokens := randTokensSeeded(1024)
	dst := make([]uint64, 0, 64)
	p := Prompt{Model: "sim-model", LoRA: "l", CacheSalt: "c", MM: []MMItem{{ID: "x", Offset: 20, Length: 100}}}
	digests := make([]Digest, 0, 64)
	for _, s := range allSchemes {
		h := mustNew(t, s, "", 16)
		if n := testing.AllocsPerRun(50, func() { dst, _ = h.AppendPrompt(dst[:0], tokens, p) }); n != 0 {
			t.Errorf("%v: AppendPrompt allocates %v times", s, n)
		}
		if digestSize(s) != 0 {
			if n := testing.AllocsPerRun(50, func() { digests, _ = h.AppendDigests(digests[:0], h.NoneHash(), tokens, p, 0) }); n != 0 {
				t.Errorf("%v: AppendDigests allocates %v times", s, n)
			}
			continue
		}
		if n := testing.AllocsPerRun(50, func() { dst, _ = h.AppendChain(dst[:0], 7, tokens) }); n != 0 {
			t.Errorf("%v: AppendChain allocates %v times", s, n)
		}
	}
}

// randTokensSeeded returns n sim-like token ids, the same on every call.
func randTokensSeeded(n int) []uint32 {
	out := make([]uint32, n)
	x := uint32(2166136261)
	for i := range out {
		x = (x ^ uint32(i)) * 16777619
		out[i] = x
	}
	return out
}
