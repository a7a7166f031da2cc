package main

import (
	"flag"

	"github.com/prefixd/prefixd/indexer/blockhash"
)

// hashFlags are the flags every command that hashes prompts takes, under
// the same names: register them, parse, then call hasher and prompt.
type hashFlags struct {
	scheme    string
	seed      string
	model     string
	blockSize int
	lora      string
	cacheSalt string

	parsed blockhash.Scheme // set by hasher
}

// register adds the flags of commands that hash one prompt (hash, query).
func (h *hashFlags) register(fs *flag.FlagSet) {
	h.registerScheme(fs)
	fs.StringVar(&h.model, "model", "", "served model name (default: the --chat body's \"model\")")
	fs.StringVar(&h.lora, "lora", "", "LoRA adapter the request targets (default: the --chat body's \"lora\")")
	fs.StringVar(&h.cacheSalt, "cache-salt", "", "the request's cache_salt (vllm-sha256-cbor, vllm-xxhash-cbor and xxh3; the llmd chain\nhas none; default: the --chat body's \"cache_salt\")")
}

// registerIndex adds the hash flags of commands that build an index
// (replay, serve), where they describe the fleet's engines. Queries carry
// their own cache salt.
func (h *hashFlags) registerIndex(fs *flag.FlagSet) {
	h.registerScheme(fs)
	fs.StringVar(&h.model, "model", "", "served model of publishers whose topic names none (kv@<pod>@<model> topics name their own)")
	fs.StringVar(&h.lora, "lora", "", "a LoRA adapter served on that model, known before events name it (events' lora_name teach the rest)")
}

func (h *hashFlags) registerScheme(fs *flag.FlagSet) {
	fs.StringVar(&h.scheme, "hash-scheme", "llmd", "block hash chain: "+blockhash.SchemeNames)
	fs.StringVar(&h.seed, "hash-seed", "", "the engine's hash seed: the sim's --hash-seed, vLLM's PYTHONHASHSEED\n"+
		"(default \"\"; for vllm-sha256-cbor \""+blockhash.VLLMDefaultSeed+"\", vLLM's seed when PYTHONHASHSEED\n"+
		"is unset; vllm-xxhash-cbor has none: unset, each vLLM process draws a random seed)")
	fs.IntVar(&h.blockSize, "block-size", 16, "the engine's tokens per block")
}

// hasher validates the parsed flags of fs and builds their Hasher. Errors
// are usage errors, reported on fs's output.
func (h *hashFlags) hasher(fs *flag.FlagSet) (*blockhash.Hasher, error) {
	scheme, err := blockhash.ParseScheme(h.scheme)
	if err != nil {
		return nil, usageErrorf(fs, "--hash-scheme: %v", err)
	}
	h.parsed = scheme
	seedSet := false
	fs.Visit(func(f *flag.Flag) { seedSet = seedSet || f.Name == "hash-seed" })
	seed := h.seed
	if !seedSet {
		seed = blockhash.DefaultSeed(scheme)
	}
	if scheme == blockhash.LLMD && h.cacheSalt != "" {
		return nil, usageErrorf(fs, "--cache-salt: the llmd chain hashes no cache salt (llm-d and its sim ignore it); leave it out")
	}
	hs, err := blockhash.New(blockhash.Config{Scheme: scheme, Seed: seed, BlockSize: h.blockSize})
	if err != nil {
		return nil, usageErrorf(fs, "%v", err)
	}
	return hs, nil
}

// prompt returns the flags' model, adapter and salt as a Prompt, with
// body's (a request body's) standing in for flags not given; call it after
// hasher. The llmd and xxh3 chains need a model; vLLM's hash none.
func (h *hashFlags) prompt(fs *flag.FlagSet, body blockhash.Prompt) (blockhash.Prompt, error) {
	p := body
	for _, f := range []struct{ flag, field *string }{{&h.model, &p.Model}, {&h.lora, &p.LoRA}, {&h.cacheSalt, &p.CacheSalt}} {
		if *f.flag != "" {
			*f.field = *f.flag
		}
	}
	if p.Model == "" && (h.parsed == blockhash.LLMD || h.parsed == blockhash.XXH3) {
		return blockhash.Prompt{}, usageErrorf(fs, "--model is required: the %s chain starts from the served model's name", h.scheme)
	}
	return p, nil
}
