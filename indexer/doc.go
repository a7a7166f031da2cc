// Package indexer applies replicas' KV cache events to a block store and
// answers longest-prefix queries over it.
//
// # Basics
//
// New builds an Indexer over a store.Store. Apply takes one decoded batch
// of a pod (named by its topic's ip:port, plus "#rank" for data-parallel
// ranks above 0) and applies its events in order: BlockStored adds blocks,
// BlockRemoved removes them from one tier, AllBlocksCleared clears the pod.
// Match hashes a query (token ids, chat messages or a prompt, or given block
// hashes) and reports, per pod, the longest run of leading blocks it holds,
// per tier, with a tier-weighted score.
//
// Each model is keyed in one of two ways (KeyMode):
//   - engine: the engine's block hashes are the keys. Exact, even for
//     events whose blocks do not continue their parent, but only useful when
//     prefixd hashes queries exactly as the engine does.
//   - tokens: prefixd's own XXH3 chain over token_ids is the key, with a
//     per-pod map from engine hash to key for removals. Works whatever the
//     engine's seed or scheme, but cannot key events whose blocks do not
//     continue their parent (llm-d-inference-sim sends such events) nor
//     blocks whose parent it never saw.
//
// auto starts undecided, holds batches, and re-chains each BlockStored from
// its parent and tokens with the configured scheme: the first event without
// a parent that reproduces the engine's hashes proves the whole chain and
// settles on engine; AutoDecideAfter such events that do not settle on
// tokens. Every re-chain in every mode is counted, and mismatches are
// explained by reason (root, block_size, token_count, non_contiguous, chain).
//
// # Caveats
//
// Apply records each batch's seq but does not check it: callers order a
// pod's batches, detect gaps and restarts, and call Reset or SetStale.
// Blocks of events with extra keys (multimodal, cache salt) are keyed
// exactly only in engine mode.
package indexer
