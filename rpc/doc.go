// Package rpc serves prefixd's index to routers and endpoint pickers: the
// gRPC IndexService of proto/prefixd/v1 (Match, Score, Pods, Stats), the
// standard gRPC health service, server reflection (grpcurl works without
// the .proto), and Match and Pods as JSON over HTTP.
//
// # Basics
//
// New builds a Server over an indexer.Indexer with Options: Limits, a
// Metrics built from a prometheus.Registerer (which may be nil), an
// optional StatsSource for ingest rates, and a logger. NewGRPCServer
// returns a grpc.Server with everything registered; serve it on a listener,
// call SetServing(false) when shutting down and stop it with GracefulStop.
// Limits.AddFlags registers the limits' flags. HTTPHandler (or
// NewHTTPHandler) serves POST /v1/match and GET /v1/pods for mounting next
// to /metrics; it shares the server's limits and concurrency slots.
//
// A query gives exactly one input: token ids, block hashes, completion
// text or chat messages (tokenized here with llm-d-inference-sim's
// tokenizer, as the indexer would). Errors are gRPC statuses:
// InvalidArgument for a query without or with several inputs, or over
// MaxTokens or MaxBlockHashes (the message names the limit); NotFound for
// an unknown model, naming the known ones; ResourceExhausted when
// MaxConcurrent queries already run (gRPC's own message size check also
// answers ResourceExhausted, naming the limit); DeadlineExceeded and
// Canceled from the call's context, which every query honours.
//
// Score answers what llm-d's precise-prefix-cache-scorer computes from its
// own index: the matched pods' scores min-max normalized to 0..1, all 1
// when equal, 0 for candidate pods without a match.
//
// The server is built for tens of thousands of block hash queries per
// second on two cores, with a client on the same machine. Match and Score decode into pooled requests whose
// slices the codec (rpc/internal/codec) refills in place, a query's other
// buffers (indexer query, tokens of text) come from a sync.Pool, gRPC gets
// a buffer pool with a tier per power of two and a few long-lived stream
// workers, and metric children are resolved once. BenchmarkGRPCMatch
// measures it over loopback TCP while events are applied.
//
// # Caveats
//
// Queries over the concurrency limit are refused, not queued: callers
// retry or fall back to another scorer. Block hash queries of a model kept
// in key mode tokens are refused up front only when the query names the
// base model; through a LoRA adapter's name the indexer refuses them, which
// surfaces as Internal. HTTP block hashes are JSON numbers: clients whose
// JSON numbers are float64 lose precision above 2^53 and should use gRPC.
package rpc
