package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/client"
	"github.com/prefixd/prefixd/store/memory"
)

// benchFleet is an index of 100 pods, each holding a distinct prompt of
// 512 blocks (8192 tokens) that queries ask for, and benchFiller more
// that fill the index to about a million blocks, as a fleet's is.
type benchFleet struct {
	ix     *indexer.Indexer
	tokens [][]uint32
	hashes [][]uint64
	h      *blockhash.Hasher
}

const (
	benchPods   = 100
	benchBlocks = 512
	benchFiller = 19
)

func newBenchFleet(b *testing.B) *benchFleet {
	st, err := memory.New(memory.Options{CapacityBlocks: 2 << 20})
	if err != nil {
		b.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{
		testModel: {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine},
	}
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	h, err := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, BlockSize: 16})
	if err != nil {
		b.Fatal(err)
	}
	f := &benchFleet{ix: ix, h: h}
	rng := rand.New(rand.NewPCG(1, 2))
	for p := range benchPods {
		toks := make([]uint32, benchBlocks*16)
		for i := range toks {
			toks[i] = rng.Uint32()
		}
		keys, err := h.AppendPrompt(nil, toks, blockhash.Prompt{Model: testModel})
		if err != nil {
			b.Fatal(err)
		}
		f.tokens = append(f.tokens, toks)
		f.hashes = append(f.hashes, keys)
		bt := &events.Batch{Topic: fmt.Appendf(nil, "kv@10.0.%d.%d:8000@%s", p/256, p%256, testModel), Seq: 1,
			Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: keys}}}
		for range benchFiller {
			filler := make([]uint64, benchBlocks)
			for i := range filler {
				filler[i] = rng.Uint64()
			}
			bt.Events = append(bt.Events, events.Event{Kind: events.KindBlockStored, BlockHashes: filler})
		}
		if _, err := ix.Apply(context.Background(), bt, indexer.Source{}); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

// ingest applies events to one more pod until ctx ends, one batch per
// millisecond: 16 BlockStored events of 8 blocks, then their BlockRemoved
// (about 128k blocks stored and 128k removed per second). It returns the
// blocks applied.
func (f *benchFleet) ingest(ctx context.Context) (blocks int64, err error) {
	const pod = "10.9.9.9:8000"
	rng := rand.New(rand.NewPCG(3, 4))
	stored := &events.Batch{Topic: []byte("kv@" + pod + "@" + testModel)}
	removed := &events.Batch{Topic: stored.Topic}
	for range 16 {
		keys := make([]uint64, 8)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		stored.Events = append(stored.Events, events.Event{Kind: events.KindBlockStored, BlockHashes: keys})
		removed.Events = append(removed.Events, events.Event{Kind: events.KindBlockRemoved, BlockHashes: keys})
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var seq uint64
	for {
		select {
		case <-ctx.Done():
			return blocks, nil
		case <-tick.C:
		}
		bt := stored
		if seq%2 == 1 {
			bt = removed
		}
		seq++
		bt.Seq = seq
		if _, err := f.ix.Apply(context.Background(), bt, indexer.Source{}); err != nil {
			return blocks, err
		}
		blocks += 16 * 8
	}
}

// benchCallers is the number of goroutines calling in BenchmarkGRPCMatch,
// per GOMAXPROCS. One per P already keeps a 2-core machine busy (the load
// generator shares it): more adds queueing to latency and no throughput.
var benchCallers = flag.Int("rpc.callers", 1, "BenchmarkGRPCMatch: concurrent callers per GOMAXPROCS")

// BenchmarkGRPCMatch measures Match over gRPC on loopback TCP, the server
// in-process with about a million blocks indexed (benchFleet), -rpc.callers
// concurrent callers per P on 4 connections, while another pod's events
// are applied: by 512 block hashes and by 8192 token
// ids (512 blocks hashed by the server), each query matching one pod whole.
// Reports queries/s and the p50 and p99 latency seen by the callers.
func BenchmarkGRPCMatch(b *testing.B) {
	f := newBenchFleet(b)
	srv, err := New(f.ix, DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := srv.NewGRPCServer()
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	defer func() {
		g.Stop()
		if err := <-served; err != nil {
			b.Error(err)
		}
	}()
	const nconns = 4
	apis := make([]prefixdv1.IndexServiceClient, nconns)
	for i := range apis {
		conn, err := grpc.NewClient(lis.Addr().String(), client.DialOptions()...)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		apis[i] = prefixdv1.NewIndexServiceClient(conn)
	}

	for _, bc := range []struct {
		name string
		req  func(p int) *prefixdv1.Query
	}{
		{"hashes-512", func(p int) *prefixdv1.Query {
			return &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes[p]}
		}},
		{"tokens-8k", func(p int) *prefixdv1.Query {
			return &prefixdv1.Query{Model: testModel, TokenIds: f.tokens[p]}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reqs := make([]*prefixdv1.Query, benchPods)
			for p := range reqs {
				reqs[p] = bc.req(p)
			}
			ctx, stop := context.WithCancel(context.Background())
			var (
				ingested  int64
				ingestErr error
				ingestWG  sync.WaitGroup
			)
			ingestWG.Go(func() { ingested, ingestErr = f.ingest(ctx) })

			var (
				mu        sync.Mutex
				latencies []time.Duration
				worker    atomic.Int64
			)
			b.ReportAllocs()
			b.SetParallelism(*benchCallers)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				w := int(worker.Add(1))
				api := apis[w%nconns]
				local := make([]time.Duration, 0, 1024)
				p := w
				for pb.Next() {
					p = (p + 7) % benchPods
					t0 := time.Now()
					resp, err := api.Match(context.Background(), reqs[p])
					local = append(local, time.Since(t0))
					if err != nil {
						b.Error(err)
						return
					}
					if len(resp.GetPods()) != 1 || resp.GetPods()[0].GetBlocks() != benchBlocks {
						b.Errorf("query %d: %v", p, resp.GetPods())
						return
					}
				}
				mu.Lock()
				latencies = append(latencies, local...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			stop()
			ingestWG.Wait()
			if ingestErr != nil {
				b.Fatal(ingestErr)
			}
			slices.Sort(latencies)
			if len(latencies) > 0 {
				pct := func(q float64) float64 {
					return float64(latencies[min(len(latencies)-1, int(q*float64(len(latencies))))].Microseconds()) / 1000
				}
				b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "queries/s")
				b.ReportMetric(pct(0.50), "p50-ms")
				b.ReportMetric(pct(0.99), "p99-ms")
				b.ReportMetric(float64(ingested)/elapsed.Seconds(), "ingested-blocks/s")
			}
		})
	}
}

// BenchmarkServerMatch calls the server's Match directly, without gRPC:
// what the server itself (limits, pooled query, indexer, response) costs
// for a query of 512 block hashes that one of 100 pods holds whole.
func BenchmarkServerMatch(b *testing.B) {
	f := newBenchFleet(b)
	srv, err := New(f.ix, DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	req := &prefixdv1.Query{Model: testModel, BlockHashes: f.hashes[42]}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := srv.Match(ctx, req)
		if err != nil || len(resp.GetPods()) != 1 {
			b.Fatalf("%v %v", resp, err)
		}
	}
}

// BenchmarkHTTPMatch measures POST /v1/match over loopback HTTP/1.1 (the
// handler in-process, keep-alive connections, one caller per P) on the
// benchFleet: by 512 block hashes and by 8192 token ids as JSON, and a
// chat of about 2k tokens tokenized by the server. Reports queries/s.
func BenchmarkHTTPMatch(b *testing.B) {
	f := newBenchFleet(b)
	srv, err := New(f.ix, DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv.HTTPHandler())
	defer hs.Close()
	chat := strings.Repeat("Summarize the report, keeping every number as written. ", 200)
	for _, bc := range []struct {
		name string
		body func(p int) []byte
	}{
		{"hashes-512", func(p int) []byte {
			body, _ := json.Marshal(map[string]any{"model": testModel, "block_hashes": f.hashes[p]})
			return body
		}},
		{"tokens-8k", func(p int) []byte {
			body, _ := json.Marshal(map[string]any{"model": testModel, "token_ids": f.tokens[p]})
			return body
		}},
		{"chat", func(p int) []byte {
			body, _ := json.Marshal(map[string]any{"model": testModel, "messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%d %s", p, chat)}}})
			return body
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bodies := make([][]byte, benchPods)
			for p := range bodies {
				bodies[p] = bc.body(p)
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				p := int(worker.Add(1))
				for pb.Next() {
					p = (p + 7) % benchPods
					resp, err := client.Post(hs.URL+"/v1/match", "application/json", bytes.NewReader(bodies[p]))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("query %d: %s", p, resp.Status)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "queries/s")
		})
	}
}
