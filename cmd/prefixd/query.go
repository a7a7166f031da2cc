package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/rpc/client"
	"github.com/prefixd/prefixd/rpc/querybody"
)

// runQuery asks a running prefixd which pods hold how much of one prompt.
func runQuery(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("query", "(--chat FILE | --prompt TEXT | --tokens 1,2,3 | --block-hashes H1,H2) --model M", stderr)
	var (
		addr      = fs.String("addr", "localhost:50051", "prefixd's gRPC address, HOST:PORT")
		model     = fs.String("model", "", "served model name, or a LoRA adapter's name (default: the --chat body's \"model\")")
		lora      = fs.String("lora", "", "LoRA adapter the request targets, when --model names the base model")
		cacheSalt = fs.String("cache-salt", "", "the request's cache_salt")
		chat      = fs.String("chat", "", "file holding an OpenAI chat-completions or completions request body as sent,\na recorded request line {\"request\": {...}}, or a bare messages array;\nfields a query does not use are skipped, text is tokenized by the server")
		prompt    = fs.String("prompt", "", "completion prompt text, tokenized by the server")
		tokens    = fs.String("tokens", "", "token ids, comma-separated")
		hashes    = fs.String("block-hashes", "", "block hashes (index keys), comma-separated")
		pods      = fs.String("pods", "", "candidate pods, comma-separated (default the --chat body's \"pods\", or all)")
		timeout   = fs.Duration("timeout", 5*time.Second, "deadline of the query")
		asJSON    = fs.Bool("json", false, `print one line {"total_blocks": N, "pods": {"ip:port": {"blocks": n, "tokens": n, "score": s}}},`+"\nas prefixd replay --query does")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf(fs, "unexpected arguments %q", fs.Args())
	}
	inputs, input := 0, ""
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "chat", "prompt", "tokens", "block-hashes":
			inputs++
			input = f.Name
		}
	})
	if inputs != 1 {
		return usageErrorf(fs, "give exactly one of --chat, --prompt, --tokens and --block-hashes")
	}
	if *timeout <= 0 {
		return usageErrorf(fs, "--timeout %v: want > 0", *timeout)
	}

	q := new(client.Query)
	var err error
	switch input {
	case "chat":
		body, err := readQuery(*chat)
		if err != nil {
			return err
		}
		q = clientQuery(&body)
	case "prompt":
		q.Prompt = *prompt
	case "tokens":
		if q.TokenIDs, err = parseTokenIDs(*tokens); err != nil {
			return usageErrorf(fs, "--tokens: %v", err)
		}
	default:
		if q.BlockHashes, err = parseBlockHashes(*hashes); err != nil {
			return usageErrorf(fs, "--block-hashes: %v", err)
		}
	}
	// Flags given stand in for the body's fields.
	for _, f := range []struct{ flag, field *string }{{model, &q.Model}, {lora, &q.LoRA}, {cacheSalt, &q.CacheSalt}} {
		if *f.flag != "" {
			*f.field = *f.flag
		}
	}
	if *pods != "" {
		q.Pods = nil
		for _, p := range strings.Split(*pods, ",") {
			if p = strings.TrimSpace(p); p != "" {
				q.Pods = append(q.Pods, p)
			}
		}
	}
	if q.Model == "" {
		return usageErrorf(fs, "--model is required (a request body's \"model\" stands in for it)")
	}

	c, err := client.Dial(*addr)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // the answer is in; a close error changes nothing
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	res, err := c.Match(ctx, q)
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(newQueryAnswer(indexerResult(res)))
	}
	return printMatch(stdout, res)
}

// readQuery reads the query of a request file as `prefixd replay --query`
// reads each line: a body, a recorded request's "request", or a bare
// messages array.
func readQuery(path string) (indexer.Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return indexer.Query{}, fmt.Errorf("--chat: %w", err)
	}
	var q indexer.Query
	if err := querybody.DecodeRecord(data, &q); err != nil {
		return indexer.Query{}, fmt.Errorf("--chat %s: %w", path, err)
	}
	return q, nil
}

// clientQuery is q as the client asks it.
func clientQuery(q *indexer.Query) *client.Query {
	out := &client.Query{
		Model: q.Model, LoRA: q.LoRA, CacheSalt: q.CacheSalt,
		TokenIDs: q.TokenIDs, BlockHashes: q.BlockHashes, Prompt: q.Prompt, Pods: q.Pods,
	}
	for _, m := range q.Messages {
		cm := client.Message{Role: m.Role, Content: m.Content.Text}
		for _, p := range m.Content.Parts {
			cm.Parts = append(cm.Parts, client.Part{Type: p.Type, Text: p.Text})
		}
		out.Messages = append(out.Messages, cm)
	}
	return out
}

// parseBlockHashes parses comma-separated uint64 block hashes.
func parseBlockHashes(s string) ([]uint64, error) {
	parts := strings.Split(s, ",")
	out := make([]uint64, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("hash %d %q: want an integer in 0..18446744073709551615", i, strings.TrimSpace(p))
		}
		out = append(out, v)
	}
	return out, nil
}

// indexerResult turns a client result into the indexer's, the input of
// newQueryAnswer, so that query and replay print the same JSON.
func indexerResult(res *client.Result) *indexer.Result {
	out := &indexer.Result{Model: res.Model, BlockSize: res.BlockSize, Tokens: res.Tokens, TotalBlocks: res.TotalBlocks}
	for _, p := range res.Pods {
		pm := indexer.PodMatch{Pod: p.Pod, Blocks: p.Blocks, Tokens: p.Tokens, Score: p.Score, Stale: p.Stale}
		pm.TierBlocks[0], pm.TierBlocks[1], pm.TierBlocks[2] = p.GPUBlocks, p.CPUBlocks, p.DiskBlocks
		out.Pods = append(out.Pods, pm)
	}
	return out
}

// printMatch prints a result as a table, best pod first.
func printMatch(w io.Writer, res *client.Result) error {
	bw := bufio.NewWriter(w)
	if res.Tokens > 0 {
		fmt.Fprintf(bw, "model %s: %d tokens, %d blocks of %d tokens\n", res.Model, res.Tokens, res.TotalBlocks, res.BlockSize)
	} else {
		fmt.Fprintf(bw, "model %s: %d blocks of %d tokens\n", res.Model, res.TotalBlocks, res.BlockSize)
	}
	if len(res.Pods) == 0 {
		fmt.Fprintln(bw, "no pod holds the first block")
		return bw.Flush()
	}
	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tBLOCKS\tTOKENS\tGPU\tCPU\tDISK\tSCORE\tSTALE")
	for _, p := range res.Pods {
		stale := ""
		if p.Stale {
			stale = "stale"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.3f\t%s\n", p.Pod, p.Blocks, p.Tokens, p.GPUBlocks, p.CPUBlocks, p.DiskBlocks, p.Score, stale)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.Flush()
}
