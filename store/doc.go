// Package store is the contract between the indexer and the block index:
// which pods hold which block keys, on which tier, and what every prefixd
// process sharing one index must agree on (each pod's applied seq, stale
// mark and engine-hash map; each model's key mode and LoRA adapters).
//
// # Basics
//
// A Store maps uint64 block keys to holders. Apply applies one pod's
// batch of events as one Batch of Ops, OpAdd for BlockStored, OpRemove
// for BlockRemoved and OpClear for AllBlocksCleared, and records the
// batch's Seq as the pod's applied seq; a batch at or below it is a
// duplicate and changes nothing, so replays, restarts and several
// replicas applying the same events converge. In tokens key mode an OpAdd
// also records engine hash -> key pairs, through which later ops (and
// EngineKeys) name blocks by engine hash. ForgetPod forgets a pod
// altogether (its engine restarted, or it left the fleet); SetStale marks
// a pod whose events are known to be incomplete. Lookup answers "how long
// a prefix of this query does each pod hold" by walking the keys in order
// and stopping as soon as no candidate pod still matches; Pods reports
// what the store knows of each pod. Models, DecideKeyMode and AddLoRA keep
// the model state: the first process to decide a model's key mode, or an
// adapter's base model, decides for all.
//
// Backends live in sub-packages (store/memory is the default). Every backend
// runs the conformance suite in store/storetest, which pins the edge cases
// of this contract: empty queries, a miss in the middle of a chain, pod
// filters that leave nothing, tiers, batches (order, duplicates, invalid
// ops, failures part way), the engine-hash map, clearing, forgetting,
// stale marks, model state and capacity.
//
// # Caveats
//
// A Lookup is not a snapshot: with concurrent writers each key is read
// consistently, but the walk may see a pod's later blocks change while it
// runs. A batch is atomic for its pod's seq, not for readers: a lookup may
// see part of a batch applied. Bounded backends forget blocks when full,
// so a pod may hold more than the store reports; they count what they
// forget, and a pair whose block was forgotten resolves nothing.
package store
