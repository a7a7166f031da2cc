package blockhash

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// These tests hash random prompts both here and in Python, with the
// libraries vLLM's sha256_cbor and xxhash_cbor call (cbor2, hashlib,
// xxhash), and compare NONE_HASH, every digest and every published key.

// python is Debian's system interpreter, which has python3-cbor2 and
// python3-xxhash; the python3 first on PATH may not.
const python = "/usr/bin/python3"

// vllmChainsPy restates vLLM's hashing for the cases on stdin: vllm/utils/
// hashing.py (sha256_cbor, xxhash_cbor) and vllm/v1/core/kv_cache_utils.py
// (init_none_hash with PYTHONHASHSEED set, hash_block_tokens,
// generate_block_hash_extra_keys, maybe_convert_block_hash).
const vllmChainsPy = `import hashlib
import json
import sys

import cbor2
import xxhash

MASK = (1 << 64) - 1


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def xxhash_cbor(x):
    return xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))


def extra_keys(c, start, end):
    mm = [(i, off - start) for i, off, n in c["mm"] if end > off and start < off + n]
    keys = ([c["lora"]] if c["lora"] else []) + mm + ([c["salt"]] if start == 0 and c["salt"] else [])
    return tuple(keys) if keys else None


def chain(hash_fn, c):
    none = hash_fn(c["seed"])
    parent, out = None, []
    bs, tokens = c["block_size"], c["tokens"]
    for start in range(0, len(tokens) - bs + 1, bs):
        parent = hash_fn((parent or none, tuple(tokens[start:start + bs]), extra_keys(c, start, start + bs)))
        out.append(parent)
    return {"none": none.hex(), "digests": [d.hex() for d in out],
            "keys": [int.from_bytes(d, "big") & MASK for d in out]}


cases = json.load(sys.stdin)
json.dump([{"vllm-sha256-cbor": chain(sha256_cbor, c), "vllm-xxhash-cbor": chain(xxhash_cbor, c)}
           for c in cases], sys.stdout)
`

// pyCase is one prompt as the script reads it; MM items are [id, offset, length].
type pyCase struct {
	Seed      string   `json:"seed"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	LoRA      string   `json:"lora"`
	MM        [][3]any `json:"mm"`
	Salt      string   `json:"salt"`
}

// pyChain is one scheme's chain of a case as the script computed it.
type pyChain struct {
	None    string   `json:"none"`
	Digests []string `json:"digests"`
	Keys    []uint64 `json:"keys"`
}

// requirePython skips the test when python cannot import cbor2 and xxhash,
// or fails it when CI=true.
func requirePython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-I", "-c", "import cbor2, xxhash; xxhash.xxh3_128_digest").CombinedOutput()
	if err == nil {
		return
	}
	why := fmt.Sprintf("%s cannot import cbor2 and xxhash: %v", python, err)
	if out = bytes.TrimSpace(out); len(out) > 0 {
		why += ": " + string(out)
	}
	why += " (scripts/test-deps.sh installs python3-cbor2 and python3-xxhash)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("the Python cross-check of vLLM's chains is required under CI=true: %s", why)
	}
	t.Skipf("skipping: %s", why)
}

// runPython runs vllmChainsPy over cases and returns its chains by scheme.
func runPython(t *testing.T, cases []pyCase) []map[string]pyChain {
	t.Helper()
	requirePython(t)
	script := filepath.Join(t.TempDir(), "vllm_chains.py")
	if err := os.WriteFile(script, []byte(vllmChainsPy), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), python, "-I", script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", python, script, err, stderr.Bytes())
	}
	var res []map[string]pyChain
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("script output: %v", err)
	}
	if len(res) != len(cases) {
		t.Fatalf("script answered %d cases; want %d", len(res), len(cases))
	}
	return res
}

// randText returns a string of n bytes, non-ASCII when r says so, so that
// text heads of every width are hashed.
func randText(r *rand.Rand, prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for b.Len() < n {
		if r.IntN(8) == 0 {
			b.WriteString("ü")
		} else {
			b.WriteByte(byte('a' + r.IntN(26)))
		}
	}
	return b.String()
}

// randCase returns a prompt with a LoRA adapter, multimodal items and a
// cache salt each present or not, and its Prompt.
func randCase(r *rand.Rand, seed string) (pyCase, Prompt) {
	c := pyCase{Seed: seed, BlockSize: []int{1, 4, 16, 16, 16, 32}[r.IntN(6)], MM: [][3]any{}}
	c.Tokens = randTokens(r, r.IntN(6*c.BlockSize+3))
	var p Prompt
	if r.IntN(2) == 0 {
		c.LoRA = randText(r, "lora-", []int{6, 24, 40}[r.IntN(3)])
	}
	if r.IntN(2) == 0 {
		c.Salt = randText(r, "salt-", []int{6, 30, 300}[r.IntN(3)])
	}
	for pos := r.IntN(8); pos < len(c.Tokens) && r.IntN(3) > 0; {
		it := MMItem{ID: randText(r, "mm-", []int{5, 23, 24, 260}[r.IntN(4)]), Offset: pos, Length: 1 + r.IntN(2*c.BlockSize)}
		p.MM = append(p.MM, it)
		c.MM = append(c.MM, [3]any{it.ID, it.Offset, it.Length})
		pos = it.Offset + it.Length + r.IntN(c.BlockSize)
	}
	p.LoRA, p.CacheSalt = c.LoRA, c.Salt
	return c, p
}

func TestVLLMChainsMatchPython(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var cases []pyCase
	var prompts []Prompt
	for _, seed := range []string{"", "0", "42", VLLMDefaultSeed, "sëed", randText(r, "long-seed-", 300)} {
		for range 12 {
			c, p := randCase(r, seed)
			cases = append(cases, c)
			prompts = append(prompts, p)
		}
	}
	// A block longer than 255 tokens: a three-byte array head.
	cases = append(cases, pyCase{Seed: "7", BlockSize: 300, Tokens: randTokens(r, 700), LoRA: "l",
		MM: [][3]any{{"img", 290, 20}}, Salt: "s"})
	prompts = append(prompts, Prompt{LoRA: "l", CacheSalt: "s", MM: []MMItem{{ID: "img", Offset: 290, Length: 20}}})

	res := runPython(t, cases)
	for i, c := range cases {
		for _, s := range vllmSchemes {
			want, ok := res[i][s.String()]
			if !ok {
				t.Fatalf("case %d: the script gave no %v chain", i, s)
			}
			h := mustNew(t, s, c.Seed, c.BlockSize)
			p := prompts[i]
			name := fmt.Sprintf("case %d %v (seed %q, block %d, %d tokens, lora %t, %d mm, salt %t)",
				i, s, c.Seed, c.BlockSize, len(c.Tokens), c.LoRA != "", len(c.MM), c.Salt != "")
			if got := h.NoneHash().String(); got != want.None {
				t.Errorf("%s: NONE_HASH %s, want %s", name, got, want.None)
			}
			keys, err := h.AppendPrompt(nil, c.Tokens, p)
			if err != nil || !slices.Equal(keys, want.Keys) {
				t.Errorf("%s: keys %v, %v; want %v", name, keys, err, want.Keys)
			}
			ds, err := h.AppendDigests(nil, h.NoneHash(), c.Tokens, p, 0)
			if err != nil || len(ds) != len(want.Digests) {
				t.Fatalf("%s: %d digests, %v; want %d", name, len(ds), err, len(want.Digests))
			}
			for j, d := range ds {
				if d.String() != want.Digests[j] || d.Key() != want.Keys[j] {
					t.Errorf("%s: block %d: digest %v key %d, want %s %d", name, j, d, d.Key(), want.Digests[j], want.Keys[j])
				}
			}
			// Continuing from a digest in the middle places the salt and
			// the items as hashing from the start does.
			if len(ds) > 2 {
				k := len(ds) / 2
				first := k * c.BlockSize
				tail, err := h.AppendDigests(nil, ds[k-1], c.Tokens[first:], p, first)
				if err != nil || !slices.Equal(tail, ds[k:]) {
					t.Errorf("%s: chain from digest %d = %v, %v; want %v", name, k-1, tail, err, ds[k:])
				}
			}
		}
	}
}
