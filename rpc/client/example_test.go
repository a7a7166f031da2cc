package client_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/rpc"
	"github.com/prefixd/prefixd/rpc/client"
	"github.com/prefixd/prefixd/store/memory"
)

// A picker asks which pods already hold a prompt's prefix and routes to the
// best one.
func Example() {
	addr, stop := startServer()
	defer stop()

	c, err := client.Dial(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := c.Match(ctx, &client.Query{
		Model:    "sim-model",
		Messages: []client.Message{{Role: "user", Content: examplePrompt}},
	})
	if err != nil {
		fmt.Println(err) // a picker falls back to another scorer
		return
	}
	fmt.Printf("%d blocks of %d tokens\n", res.TotalBlocks, res.BlockSize)
	for _, p := range res.Pods {
		fmt.Printf("%s: %d blocks, score %.2f\n", p.Pod, p.Blocks, p.Score)
	}

	scores, err := c.Score(ctx, &client.Query{
		Model:    "sim-model",
		Messages: []client.Message{{Role: "user", Content: examplePrompt}},
		Pods:     []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, pod := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"} {
		s := scores[pod]
		fmt.Printf("%s: score %.2f, stale %v\n", pod, s.Score, s.Stale)
	}
	// Output:
	// 4 blocks of 16 tokens
	// 10.0.0.1:8000: 4 blocks, score 1.00
	// 10.0.0.2:8000: 2 blocks, score 0.50
	// 10.0.0.1:8000: score 1.00, stale false
	// 10.0.0.2:8000: score 0.00, stale false
	// 10.0.0.3:8000: score 0.00, stale false
}

const examplePrompt = "Summarize the following report in three sentences, keeping every number " +
	"exactly as written and naming each of the regions that the report covers in order of revenue, " +
	"then list the two risks it names first, and say which of them the authors think matters more. " +
	"Write for a reader who has not seen the report."

// startServer serves, on a loopback port, an index where 10.0.0.1:8000
// holds all of examplePrompt's blocks and 10.0.0.2:8000 the first two.
func startServer() (addr string, stop func()) {
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 16})
	if err != nil {
		log.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{
		"sim-model": {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine},
	}
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		log.Fatal(err)
	}
	var tk tokenize.Tokenizer
	tokens := tk.AppendChat(nil, []tokenize.Message{{Role: "user", Content: tokenize.TextContent(examplePrompt)}})
	h, err := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, BlockSize: 16})
	if err != nil {
		log.Fatal(err)
	}
	hashes, err := h.AppendPrompt(nil, tokens, blockhash.Prompt{Model: "sim-model"})
	if err != nil {
		log.Fatal(err)
	}
	for pod, n := range map[string]int{"10.0.0.1:8000": len(hashes), "10.0.0.2:8000": 2} {
		b := &events.Batch{Topic: []byte("kv@" + pod + "@sim-model"), Seq: 1,
			Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes[:n]}}}
		if _, err := ix.Apply(context.Background(), b, indexer.Source{}); err != nil {
			log.Fatal(err)
		}
	}
	srv, err := rpc.New(ix, rpc.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	g := srv.NewGRPCServer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.Serve(lis); err != nil {
			log.Print(err)
		}
	}()
	return lis.Addr().String(), func() {
		g.Stop()
		<-done
	}
}
