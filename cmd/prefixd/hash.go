package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/rpc/querybody"
)

// hashSchemesHelp ends hash's usage: which engines' block hashes prefixd
// reproduces, and what it does for those it cannot.
const hashSchemesHelp = `
Hash schemes (--hash-scheme), the engines' block hash chains prefixd reproduces:
  llmd              llm-d-inference-sim and llm-d's token processor: FNV-64a over
                    canonical CBOR, rooted in the model (or LoRA adapter) name
  vllm-sha256-cbor  vLLM --prefix-caching-hash-algo sha256_cbor: SHA-256 over
                    canonical CBOR
  vllm-xxhash-cbor  vLLM --prefix-caching-hash-algo xxhash_cbor: xxh3-128 over
                    canonical CBOR; vLLM seeds it at random per process unless
                    PYTHONHASHSEED is set, so set it on every engine and give it
                    as --hash-seed
and prefixd's own:
  xxh3              prefixd's chain over token ids, no engine's

vLLM's default algorithm, sha256, and its xxhash hash Python pickle bytes,
which cannot be reproduced outside Python. prefixd indexes such fleets in
tokens key mode (serve and replay --key-mode tokens, which auto falls back
to): it keys blocks by its own chain over each event's token_ids and maps
the engine's hashes to its keys.
`

// runHash prints the block hashes of one prompt: a chat request, a
// completion prompt or token ids.
func runHash(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("hash", "(--chat FILE | --prompt TEXT | --tokens 1,2,3)", stderr)
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprint(stderr, hashSchemesHelp)
	}
	var hf hashFlags
	hf.register(fs)
	chat := fs.String("chat", "", "file holding an OpenAI chat-completions or completions request body as sent,\na recorded request line {\"request\": {...}}, or a bare messages array;\ntext is tokenized with the sim's tokenizer")
	prompt := fs.String("prompt", "", "completion prompt text, tokenized with the sim's tokenizer")
	tokens := fs.String("tokens", "", "token ids, comma-separated")
	asJSON := fs.Bool("json", false, `print one JSON object {"token_count": N, "token_ids": [...], "block_hashes": ["...", ...]}`+"\n(hashes as decimal strings, as protojson writes 64-bit integers)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf(fs, "unexpected arguments %q", fs.Args())
	}
	inputs, input := 0, ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "chat" || f.Name == "prompt" || f.Name == "tokens" {
			inputs++
			input = f.Name
		}
	})
	if inputs != 1 {
		return usageErrorf(fs, "give exactly one of --chat, --prompt and --tokens")
	}
	h, err := hf.hasher(fs)
	if err != nil {
		return err
	}

	var ids []uint32
	var body blockhash.Prompt // of a --chat body
	switch input {
	case "chat":
		q, err := readQuery(*chat)
		if err != nil {
			return err
		}
		body = blockhash.Prompt{Model: q.Model, LoRA: q.LoRA, CacheSalt: q.CacheSalt}
		if ids, err = bodyTokens(&q); err != nil {
			return fmt.Errorf("--chat %s: %w", *chat, err)
		}
	case "tokens":
		if ids, err = parseTokenIDs(*tokens); err != nil {
			return usageErrorf(fs, "--tokens: %v", err)
		}
	default:
		ids = tokenize.AppendIDs(nil, *prompt)
	}
	p, err := hf.prompt(fs, body)
	if err != nil {
		return err
	}
	keys, err := h.AppendPrompt(make([]uint64, 0, len(ids)/h.BlockSize()), ids, p)
	if err != nil {
		return err
	}

	w := bufio.NewWriter(stdout)
	if *asJSON {
		out := struct {
			TokenCount  int              `json:"token_count"`
			TokenIDs    []uint32         `json:"token_ids"`
			BlockHashes querybody.Hashes `json:"block_hashes"`
		}{len(ids), ids, keys}
		if out.TokenIDs == nil {
			out.TokenIDs = []uint32{}
		}
		if err := json.NewEncoder(w).Encode(out); err != nil {
			return err
		}
	} else {
		var line []byte
		for _, k := range keys {
			line = strconv.AppendUint(line[:0], k, 10)
			line = append(line, '\n')
			if _, err := w.Write(line); err != nil {
				return err
			}
		}
	}
	return w.Flush()
}

// bodyTokens returns the token ids of a request body's query: its chat or
// its prompt tokenized, or its token ids.
func bodyTokens(q *indexer.Query) ([]uint32, error) {
	switch {
	case len(q.BlockHashes) > 0:
		return nil, errors.New("the body gives block hashes: there is nothing to hash")
	case len(q.Messages) > 0:
		var tk tokenize.Tokenizer
		return tk.AppendChat(nil, q.Messages), nil
	case q.Prompt != "":
		return tokenize.AppendIDs(nil, q.Prompt), nil
	case len(q.TokenIDs) > 0:
		return q.TokenIDs, nil
	}
	return nil, errors.New("the body holds no prompt: give messages, prompt or token_ids")
}

// parseTokenIDs parses comma-separated uint32 token ids.
func parseTokenIDs(s string) ([]uint32, error) {
	parts := strings.Split(s, ",")
	ids := make([]uint32, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %d %q: want an integer in 0..4294967295", i, strings.TrimSpace(p))
		}
		ids = append(ids, uint32(v))
	}
	return ids, nil
}
