// Package rpc serves prefixd's index to routers and endpoint pickers: the
// gRPC IndexService of proto/prefixd/v1 (Match, Score, Pods, Stats), the
// standard gRPC health service, server reflection (grpcurl works without
// the .proto), and the same four methods as JSON over HTTP.
//
// # Basics
//
// New builds a Server over an indexer.Indexer with Options: Limits, a
// Metrics built from a prometheus.Registerer (which may be nil), an
// optional StatsSource for ingest rates, a logger, and a recovery.Guard
// that counts and logs a panic answering a query. NewGRPCServer
// returns a grpc.Server with everything registered; serve it on a listener,
// call SetServing(false) when shutting down and stop it with GracefulStop.
// Limits.AddFlags registers the limits' flags. HTTPHandler (or
// NewHTTPHandler) serves POST /v1/match, POST /v1/score, GET /v1/pods and
// GET /v1/stats for mounting next to /metrics; it shares the server's
// limits, concurrency slots and byte budget.
//
// Match and Score take the same request, Query, and one gRPC handler
// serves both; over HTTP both take the same body, a QueryJSON, which an
// OpenAI chat-completions or completions request body is as it is (see
// rpc/querybody). 64-bit hashes and seqs in JSON, read and written, are
// decimal strings, as protojson writes them; numbers are read too.
//
// A query is admitted before its request is read: it takes one of
// MaxConcurrent slots, then reserves its bytes from MaxInflightBytes,
// shared by gRPC and HTTP (an HTTP body its Content-Length; a gRPC
// message, whose size gRPC reads with it, MaxMessageBytes), and reads the
// request into one buffer of its size. Decoding (rpc/internal/codec for
// gRPC, rpc/querybody for JSON) reserves each slice, string and
// message before allocating it and stops at the first token id or block
// hash over its limit; text is tokenized up to MaxTokens and no further.
// After decoding a gRPC query keeps reserved what its request holds; an
// HTTP query keeps its body's bytes too, until its answer is written.
// Every refusal is counted in prefixd_query_refused_total by reason.
//
// A query gives exactly one input: token ids, block hashes, completion
// text or chat messages (tokenized here with llm-d-inference-sim's
// tokenizer, as the indexer would). Errors are gRPC statuses:
// InvalidArgument for a query without or with several inputs, or over
// MaxTokens or MaxBlockHashes (the message names the limit); NotFound for
// an unknown model, naming the known ones; ResourceExhausted when
// MaxConcurrent queries already run or the byte budget has no room for
// the query (gRPC's own message size check also answers
// ResourceExhausted, naming the limit); DeadlineExceeded and Canceled from
// the call's context, which every query honours; Internal for a panic
// answering it, recovered, counted and logged (HTTP: 500).
//
// Score answers what llm-d's precise-prefix-cache-scorer computes from its
// own index: the matched pods' scores min-max normalized to 0..1, all 1
// when equal, 0 for candidate pods without a match; and, as Match says per
// pod, which matched pods are stale or incomplete.
//
// The server is built for tens of thousands of block hash queries per
// second on two cores, with a client on the same machine. Match and Score
// decode into pooled requests whose slices the codec (rpc/internal/codec)
// refills in place, a query's other buffers (indexer query, tokens of
// text) come from a sync.Pool, gRPC gets a buffer pool with a tier per
// power of two and a few long-lived stream workers, and metric children
// are resolved once. BenchmarkGRPCMatch
// measures it over loopback TCP while events are applied.
//
// # Caveats
//
// Queries over the concurrency limit or the byte budget are refused, not
// queued: callers retry or fall back to another scorer. A gRPC query holds
// MaxMessageBytes of the budget while its message is read, so at most
// MaxInflightBytes/MaxMessageBytes (64 with the defaults) are read at
// once, and a client that trickles its message holds its share until it
// is sent or the call's deadline passes (an HTTP body must arrive within
// 30 seconds). The budget bounds the memory queries hold, not the
// process's: the garbage they leave waits for the collector, which with
// GOGC=100 lets the heap grow to about twice what is live (300 concurrent
// 4 MiB bodies peaked at under 500 MB with the 256 MiB default); a memory
// limit (GOMEMLIMIT) brings that closer to the budget. Block hash queries of a model kept
// in key mode tokens are refused up front only when the query names the
// base model; through a LoRA adapter's name the indexer refuses them, which
// surfaces as Internal. Score checks the staleness of matched pods only: a
// stale candidate without a match is not named (Pods says it is stale).
package rpc
