package rpc

import (
	"context"
	"net"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/store/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testModel = "m"
	testLoRA  = "m-adapter"
	podA      = "10.0.0.1:8000"
	podB      = "10.0.0.2:8000"
)

// fleet is an indexer holding one chat: podA all of its blocks, podB the
// first half of them.
type fleet struct {
	ix       *indexer.Indexer
	messages []tokenize.Message
	tokens   []uint32
	hashes   []uint64
}

func testChat() []tokenize.Message {
	sys := strings.Repeat("You are a careful assistant who answers briefly and cites sources. ", 8)
	return []tokenize.Message{
		{Role: "system", Content: tokenize.TextContent(sys)},
		{Role: "user", Content: tokenize.TextContent("How long is the Rhine, and which countries does it flow through?")},
	}
}

func newFleet(tb testing.TB) *fleet {
	tb.Helper()
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 16})
	if err != nil {
		tb.Fatal(err)
	}
	opts := indexer.DefaultOptions()
	opts.Models = map[string]indexer.ModelOptions{
		testModel: {HashScheme: "llmd", BlockSize: 16, KeyMode: indexer.KeyModeEngine, LoRAs: []string{testLoRA}},
	}
	ix, err := indexer.New(st, opts, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	f := &fleet{ix: ix, messages: testChat()}
	var tk tokenize.Tokenizer
	f.tokens = tk.AppendChat(nil, f.messages)
	h, err := blockhash.New(blockhash.Config{Scheme: blockhash.LLMD, BlockSize: 16})
	if err != nil {
		tb.Fatal(err)
	}
	if f.hashes, err = h.AppendPrompt(nil, f.tokens, blockhash.Prompt{Model: testModel}); err != nil {
		tb.Fatal(err)
	}
	if len(f.hashes) < 4 {
		tb.Fatalf("test chat has %d blocks, want at least 4", len(f.hashes))
	}
	f.store(tb, podA, f.hashes)
	f.store(tb, podB, f.hashes[:len(f.hashes)/2])
	return f
}

func (f *fleet) store(tb testing.TB, pod string, hashes []uint64) {
	tb.Helper()
	b := &events.Batch{Topic: []byte("kv@" + pod + "@" + testModel), Seq: 7, Events: []events.Event{
		{Kind: events.KindBlockStored, BlockHashes: hashes, BlockSize: 16},
	}}
	if _, err := f.ix.Apply(context.Background(), b, indexer.Source{}); err != nil {
		tb.Fatal(err)
	}
}

// serveBufconn serves s over an in-memory listener and returns a connection
// to it, with server options (an interceptor); both are closed when the
// test ends.
func serveBufconn(tb testing.TB, s *Server, opts ...grpc.ServerOption) *grpc.ClientConn {
	tb.Helper()
	lis := bufconn.Listen(1 << 20)
	g := s.NewGRPCServer(opts...)
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		conn.Close()
		g.Stop()
		if err := <-done; err != nil {
			tb.Errorf("serve: %v", err)
		}
	})
	return conn
}

func newServer(tb testing.TB, f *fleet, opts Options) *Server {
	tb.Helper()
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits()
	}
	s, err := New(f.ix, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
