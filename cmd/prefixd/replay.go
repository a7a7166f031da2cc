package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/rpc/querybody"
)

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", "EVENTS...", stderr)
	var (
		hf      hashFlags
		keyMode = fs.String("key-mode", "auto", "index keys: engine (the engine's hashes), tokens (prefixd's own chain over token_ids), or auto")
		query   = fs.String("query", "", "JSONL file of queries, each an OpenAI chat-completions or completions request body as sent,\nor a recorded request line {\"request\": {...}} (a recording's requests.jsonl)")
		sf      storeFlags
	)
	hf.registerIndex(fs)
	sf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := sf.validate(fs); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usageErrorf(fs, "give at least one recording")
	}
	mo, err := hf.modelOptions(fs)
	if err != nil {
		return err
	}
	if mo.KeyMode, err = indexer.ParseKeyMode(*keyMode); err != nil {
		return usageErrorf(fs, "--key-mode: %v", err)
	}
	defaultModel := hf.model
	if defaultModel == "" {
		defaultModel = "default"
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	ost, err := sf.open(ctx, nil, log)
	if err != nil {
		return err
	}
	defer func() { _ = ost.close() }()
	opts := indexer.DefaultOptions()
	opts.Default = mo
	opts.DefaultModel = defaultModel
	ix, err := indexer.New(ost.Store, opts, nil, log)
	if err != nil {
		return err
	}
	rec, err := indexer.ReadRecordings(fs.Args(), defaultModel)
	if err != nil {
		return err
	}
	for _, f := range rec.TornTails {
		fmt.Fprintf(stderr, "%s: ends inside a record (still being written?); read up to it\n", f)
	}
	refused, err := ix.ApplyRecorded(ctx, rec)
	if err != nil {
		return err
	}
	for _, reason := range slices.Sorted(maps.Keys(refused)) {
		fmt.Fprintf(stderr, "refused %d batches: %s\n", refused[reason], reason)
	}
	pods, err := ix.Pods(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "applied %d messages (%d duplicates) from %d files\n", rec.Messages, rec.Duplicates, fs.NArg())
	for _, p := range pods {
		fmt.Fprintf(stderr, "pod %s model %s blocks %d seq %d key-mode %s\n", p.Name, p.Model, p.Blocks, p.Seq, ix.KeyMode(p.Model))
	}
	if *query == "" {
		return nil
	}
	return answerQueries(ctx, ix, *query, stdout)
}

// modelOptions turns the hash flags into the options of the model they
// describe, with configured LoRA adapter names.
func (h *hashFlags) modelOptions(fs *flag.FlagSet) (indexer.ModelOptions, error) {
	hs, err := h.hasher(fs)
	if err != nil {
		return indexer.ModelOptions{}, err
	}
	cfg := hs.Config()
	mo := indexer.ModelOptions{HashScheme: cfg.Scheme.String(), HashSeed: cfg.Seed, BlockSize: cfg.BlockSize}
	if h.lora != "" {
		mo.LoRAs = []string{h.lora}
	}
	return mo, nil
}

// queryAnswer is one line of replay's (and query's) JSON output.
type queryAnswer struct {
	TotalBlocks int                  `json:"total_blocks"`
	Pods        map[string]podAnswer `json:"pods"`
}

type podAnswer struct {
	Blocks int     `json:"blocks"`
	Tokens int     `json:"tokens"`
	Score  float64 `json:"score"`
	Stale  bool    `json:"stale,omitempty"`
}

func newQueryAnswer(res *indexer.Result) queryAnswer {
	a := queryAnswer{TotalBlocks: res.TotalBlocks, Pods: make(map[string]podAnswer, len(res.Pods))}
	for _, p := range res.Pods {
		a.Pods[p.Pod] = podAnswer{Blocks: p.Blocks, Tokens: p.Tokens, Score: p.Score, Stale: p.Stale}
	}
	return a
}

// answerQueries answers each line of a JSONL file of request bodies or
// recorded requests, read as prefixd query --chat reads its file.
func answerQueries(ctx context.Context, ix *indexer.Indexer, path string, stdout io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	enc := json.NewEncoder(stdout)
	for line := 1; sc.Scan(); line++ {
		var q indexer.Query
		if err := querybody.DecodeRecord(sc.Bytes(), &q); err != nil {
			return fmt.Errorf("%s line %d: %w", path, line, err)
		}
		res, err := ix.Match(ctx, &q)
		if err != nil {
			return fmt.Errorf("%s line %d: %w", path, line, err)
		}
		if err := enc.Encode(newQueryAnswer(res)); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
