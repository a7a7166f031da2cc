package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	prefixdv1 "github.com/prefixd/prefixd/proto/prefixd/v1"
	"github.com/prefixd/prefixd/rpc/internal/codec"
)

// Client calls a prefixd server's IndexService.
type Client struct {
	api  prefixdv1.IndexServiceClient
	conn *grpc.ClientConn // closed by Close; nil when the caller owns it
}

// Dial returns a Client of the server at addr ("host:port"). Without
// options the connection is plaintext; opts are applied after DialOptions.
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	conn, err := grpc.NewClient(addr, append(DialOptions(), opts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{api: prefixdv1.NewIndexServiceClient(conn), conn: conn}, nil
}

// DialOptions are Dial's defaults: plaintext, and a codec and buffer pool
// with a tier per power of two up to 4 MiB (gRPC's default tiers jump from
// 32 KiB to 1 MiB and clear the whole buffer on every use, which cost a
// query of 8192 token ids more than its encoding), and flow-control
// windows of 1 MiB a stream and 4 MiB a connection, like the server's.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec.Codec{})),
		experimental.WithBufferPool(codec.Pool),
		// As the server's: a window of many queries, not 64 KiB.
		grpc.WithInitialWindowSize(1 << 20),
		grpc.WithInitialConnWindowSize(1 << 22),
	}
}

// New returns a Client over a connection the caller owns and closes; dial
// it with DialOptions (and the caller's) to get their codec and buffer pool.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{api: prefixdv1.NewIndexServiceClient(conn)}
}

// Close closes the connection Dial opened; it does nothing for New's.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// API returns the generated client, for calls with proto messages.
func (c *Client) API() prefixdv1.IndexServiceClient { return c.api }

// Query asks which pods hold how much of a prompt, by Match or by Score.
// Give exactly one of TokenIDs, BlockHashes, Prompt or Messages.
type Query struct {
	// Model is the served model name, or a LoRA adapter's name.
	Model string
	// LoRA names the adapter when Model does not.
	LoRA      string
	CacheSalt string

	TokenIDs []uint32
	// BlockHashes are precomputed index keys (the engine's block hashes).
	BlockHashes []uint64
	// Prompt is completion text, Messages a chat: both are tokenized by the
	// server with llm-d-inference-sim's tokenizer.
	Prompt   string
	Messages []Message

	// Pods restricts Match's answer to these pods, and are the candidates
	// Score scores (0 without a match); empty means all.
	Pods []string
}

// Message is one chat message: string Content, or content Parts when
// Content is empty.
type Message struct {
	Role    string
	Content string
	Parts   []Part
}

// Part is one OpenAI content part; only "text" parts are tokenized.
type Part struct {
	Type string
	Text string
}

// Result answers a Match.
type Result struct {
	// Model is the base model the query was answered for.
	Model string
	// BlockSize is the model's tokens per block; Tokens the query's token
	// count (0 for block hashes); TotalBlocks its full blocks.
	BlockSize   int
	Tokens      int
	TotalBlocks int
	// Pods holds every pod with a matched block, best first.
	Pods []PodMatch
	// Explanation says why Pods is empty when the reason is not the
	// query's own (no event has come yet); "" otherwise.
	Explanation string
}

// PodMatch is one pod's share of a query.
type PodMatch struct {
	Pod string
	// Blocks is the longest prefix of the query's blocks the pod holds;
	// Tokens is Blocks times the block size.
	Blocks int
	Tokens int
	// GPUBlocks, CPUBlocks and DiskBlocks split Blocks by the fastest tier
	// holding each.
	GPUBlocks, CPUBlocks, DiskBlocks int
	// Score is the tier-weighted share of the query's blocks, 0..1.
	Score float64
	// Stale is true when the pod's events are known to be incomplete.
	Stale bool
	// Incomplete is true when the index forgot blocks the pod still holds,
	// to make room: it may hold a longer prefix than Blocks.
	Incomplete bool
}

// PodScore is one pod's share of a Score.
type PodScore struct {
	// Score is the pod's normalized score, 0..1.
	Score float64
	// Stale is true when the pod's events are known to be incomplete: its
	// score may be wrong either way. Only matched pods are checked.
	Stale bool
	// Incomplete is true when the index forgot blocks the pod still
	// holds, to make room: it may hold more than its score says.
	Incomplete bool
}

// PodStatus describes one pod the server knows.
type PodStatus struct {
	Name   string
	Model  string
	Blocks int
	// Seq is the last applied batch's seq, valid when HasSeq.
	Seq    uint64
	HasSeq bool
	// LastEvent is zero when no batch was applied.
	LastEvent time.Time
	Stale     bool
	// EvictedBlocks counts the pod's blocks the index forgot to make room
	// since the pod was last cleared; Incomplete is set while it is above
	// 0, and the pod's matches may then be shorter than what it holds.
	EvictedBlocks uint64
	Incomplete    bool
}

// Stats are the server's index statistics.
type Stats struct {
	Pods        int
	IndexBlocks uint64
	// MemoryBytes is the store's estimate, or the server's heap in use.
	MemoryBytes      uint64
	HeapInuseBytes   uint64
	BatchesPerSecond float64
	EventsPerSecond  float64
}

var errNilQuery = errors.New("client: nil query")

// Match answers q with every matched pod.
func (c *Client) Match(ctx context.Context, q *Query) (*Result, error) {
	if q == nil {
		return nil, errNilQuery
	}
	resp, err := c.api.Match(ctx, request(q))
	if err != nil {
		return nil, err
	}
	res := &Result{
		Model: resp.GetModel(), BlockSize: int(resp.GetBlockSize()),
		Tokens: int(resp.GetTokens()), TotalBlocks: int(resp.GetTotalBlocks()), Explanation: resp.GetExplanation(),
		Pods: make([]PodMatch, len(resp.GetPods())),
	}
	for i, p := range resp.GetPods() {
		res.Pods[i] = PodMatch{
			Pod: p.GetPod(), Blocks: int(p.GetBlocks()), Tokens: int(p.GetTokens()),
			GPUBlocks: int(p.GetGpuBlocks()), CPUBlocks: int(p.GetCpuBlocks()), DiskBlocks: int(p.GetDiskBlocks()),
			Score: p.GetScore(), Stale: p.GetStale(), Incomplete: p.GetIncomplete(),
		}
	}
	return res, nil
}

// Score answers q with pod -> score, normalized as llm-d's
// precise-prefix-cache-scorer does, and whether each scored pod is stale
// or incomplete; candidate pods (q.Pods) without a match score 0.
func (c *Client) Score(ctx context.Context, q *Query) (map[string]PodScore, error) {
	if q == nil {
		return nil, errNilQuery
	}
	resp, err := c.api.Score(ctx, request(q))
	if err != nil {
		return nil, err
	}
	out := make(map[string]PodScore, len(resp.GetScores()))
	for pod, score := range resp.GetScores() {
		out[pod] = PodScore{Score: score}
	}
	for _, pod := range resp.GetStalePods() {
		ps := out[pod]
		ps.Stale = true
		out[pod] = ps
	}
	for _, pod := range resp.GetIncompletePods() {
		ps := out[pod]
		ps.Incomplete = true
		out[pod] = ps
	}
	return out, nil
}

// Pods lists the pods the server knows, sorted by name.
func (c *Client) Pods(ctx context.Context) ([]PodStatus, error) {
	resp, err := c.api.Pods(ctx, &prefixdv1.PodsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]PodStatus, len(resp.GetPods()))
	for i, p := range resp.GetPods() {
		out[i] = PodStatus{
			Name: p.GetName(), Model: p.GetModel(), Blocks: int(p.GetBlocks()),
			Seq: p.GetSeq(), HasSeq: p.GetHasSeq(), Stale: p.GetStale(),
			EvictedBlocks: p.GetEvictedBlocks(), Incomplete: p.GetIncomplete(),
		}
		if p.GetLastEventTime() != nil {
			out[i].LastEvent = p.GetLastEventTime().AsTime()
		}
	}
	return out, nil
}

// Stats returns the server's index statistics.
func (c *Client) Stats(ctx context.Context) (*Stats, error) {
	resp, err := c.api.Stats(ctx, &prefixdv1.StatsRequest{})
	if err != nil {
		return nil, err
	}
	return &Stats{
		Pods: int(resp.GetPods()), IndexBlocks: resp.GetIndexBlocks(),
		MemoryBytes: resp.GetMemoryBytes(), HeapInuseBytes: resp.GetHeapInuseBytes(),
		BatchesPerSecond: resp.GetBatchesPerSecond(), EventsPerSecond: resp.GetEventsPerSecond(),
	}, nil
}

// request is q as the Query both Match and Score take.
func request(q *Query) *prefixdv1.Query {
	req := &prefixdv1.Query{
		Model: q.Model, Lora: q.LoRA, CacheSalt: q.CacheSalt,
		TokenIds: q.TokenIDs, BlockHashes: q.BlockHashes, Prompt: q.Prompt, Pods: q.Pods,
	}
	if len(q.Messages) > 0 {
		req.Messages = make([]*prefixdv1.ChatMessage, len(q.Messages))
		for i, m := range q.Messages {
			cm := &prefixdv1.ChatMessage{Role: m.Role, Content: m.Content}
			for _, p := range m.Parts {
				cm.Parts = append(cm.Parts, &prefixdv1.ContentPart{Type: p.Type, Text: p.Text})
			}
			req.Messages[i] = cm
		}
	}
	return req
}
