// Package indexer applies replicas' KV cache events to a block store and
// answers longest-prefix queries over it.
//
// # Basics
//
// New builds an Indexer over a store.Store. Apply takes one decoded batch
// of a pod and applies it as one store batch (store.Store.Apply): its
// events in order, BlockStored adding blocks, BlockRemoved removing them
// from one tier, AllBlocksCleared clearing the pod, and the pod's applied
// seq recorded with them. A pod is named by the endpoint its topic gives
// (kv@IP:PORT@MODEL: IP:PORT), with "#rank" only for data-parallel ranks
// above 0 that share one topic (see names.go); topics that name no pod are
// named by their source.
//
// What replicas of prefixd sharing a store must agree on lives in the
// store: each pod's applied seq, stale mark and engine-hash map, each
// model's key mode (the first process to decide records it; the others
// take it) and its LoRA adapters. Names that events give are checked
// (events.CheckLabel, events.CheckName) and a batch naming what cannot be
// right, or one pod or model past MaxPods or MaxModels, is refused whole
// (RefusedError, prefixd_batches_refused_total).
//
// A query for a model no event has named while prefixd knows no model at
// all answers no pods with an Explanation, as does one for a configured
// model no pod has sent events for; a name that cannot be right, when
// models are known, is ErrUnknownModel listing them.
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
// explained by reason (root, block_size, token_count, chain); blocks that do
// not continue their parent (non_contiguous) are counted as their own
// result, not as a mismatch.
//
// Only what a replica can reuse is indexed (groups.go): of a hybrid
// model's KV cache groups, one full-attention group per pod (the others'
// events are counted by kind and skipped); blocks whose storage is REMOTE
// to the publisher are not the pod's; a removal whose copy counts say
// copies remain removes nothing. A model's block size is learned from its
// first full-attention BlockStored event with tokens, whatever was
// configured.
//
// # Caveats
//
// The store ignores a batch at or below its pod's applied seq, but takes a
// gap as it comes: callers order a pod's batches, detect gaps and
// restarts, and call Reset or SetStale (indexer/ingest does). Batches held
// while a model's key mode is undecided are in this process only; a
// restart before the decision loses them, and the store's applied seq,
// which they did not move, says so.
// Blocks of events with extra keys (multimodal, cache salt) are keyed
// exactly only in engine mode. What the pod's events said of its KV cache
// groups, and the model's learned block size, are this process's: another
// replica sharing the store learns them from the same events.
package indexer
