package client_test

import (
	"context"
	"net"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/rpc"
	"github.com/prefixd/prefixd/rpc/client"
	"github.com/prefixd/prefixd/store/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestClientPodsStatsErrors(t *testing.T) {
	addr, stop := startServer()
	defer stop()
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	pods, err := c.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 2 || pods[0].Name != "10.0.0.1:8000" || pods[0].Blocks != 4 || pods[0].Model != "sim-model" ||
		pods[0].Seq != 1 || !pods[0].HasSeq || pods[0].LastEvent.IsZero() || pods[1].Blocks != 2 {
		t.Errorf("pods %+v", pods)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pods != 2 || st.IndexBlocks != 6 || st.MemoryBytes == 0 {
		t.Errorf("stats %+v", st)
	}
	res, err := c.Match(ctx, &client.Query{Model: "sim-model", TokenIDs: []uint32{1, 2, 3}, Pods: []string{"10.0.0.2:8000"}})
	if err != nil || res.Tokens != 3 || res.TotalBlocks != 0 || len(res.Pods) != 0 {
		t.Errorf("short query: %+v %v", res, err)
	}
	if _, err := c.Match(ctx, &client.Query{Model: "other", Prompt: "hello"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown model: %v", err)
	}
	if _, err := c.Match(ctx, nil); err == nil {
		t.Error("nil query answered")
	}
}

// A pod whose blocks the server's index forgot to make room comes back
// incomplete, in its matches and its status.
func TestClientIncomplete(t *testing.T) {
	st, err := memory.New(memory.Options{CapacityBlocks: 256})
	if err != nil {
		t.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{"m": {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine}}
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, 400)
	for i := range keys {
		keys[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	b := &events.Batch{Topic: []byte("kv@10.0.0.1:8000@m"), Seq: 1, Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: keys}}}
	if _, err := ix.Apply(context.Background(), b, indexer.Source{}); err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.New(ix, rpc.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := srv.NewGRPCServer()
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	defer func() {
		g.Stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c, err := client.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pods, err := c.Pods(context.Background())
	if err != nil || len(pods) != 1 || !pods[0].Incomplete || pods[0].EvictedBlocks == 0 {
		t.Fatalf("pods %+v, %v: want one incomplete", pods, err)
	}
	res, err := c.Match(context.Background(), &client.Query{Model: "m", BlockHashes: keys[len(keys)-16:]})
	if err != nil || len(res.Pods) != 1 || !res.Pods[0].Incomplete {
		t.Fatalf("match %+v, %v: want the pod incomplete", res, err)
	}
	// Score says so too, and says which pods are stale.
	_ = ix.SetStale(context.Background(), "10.0.0.1:8000", true)
	q := &client.Query{Model: "m", BlockHashes: keys[len(keys)-16:], Pods: []string{"10.0.0.1:8000", "10.0.0.9:8000"}}
	scores, err := c.Score(context.Background(), q)
	want := map[string]client.PodScore{"10.0.0.1:8000": {Score: 1, Stale: true, Incomplete: true}, "10.0.0.9:8000": {}}
	if err != nil || len(scores) != len(want) || scores["10.0.0.1:8000"] != want["10.0.0.1:8000"] || scores["10.0.0.9:8000"] != want["10.0.0.9:8000"] {
		t.Fatalf("score %+v, %v: want %+v", scores, err, want)
	}
	_ = ix.SetStale(context.Background(), "10.0.0.1:8000", false)
	if scores, err = c.Score(context.Background(), q); err != nil || scores["10.0.0.1:8000"].Stale {
		t.Fatalf("score %+v, %v: want the pod no longer stale", scores, err)
	}
}
