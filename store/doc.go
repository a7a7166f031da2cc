// Package store is the contract between the indexer and the block index:
// which pods hold which block keys, on which tier.
//
// # Basics
//
// A Store maps uint64 block keys to holders. Add and Remove apply the
// BlockStored and BlockRemoved events of one pod and tier; ClearPod applies
// AllBlocksCleared or the pod leaving the fleet; Lookup answers "how long a
// prefix of this query does each pod hold" by walking the keys in order and
// stopping as soon as no candidate pod still matches; Pods reports block
// counts.
//
// Backends live in sub-packages (store/memory is the default). Every backend
// runs the conformance suite in store/storetest, which pins the edge cases
// of this contract: empty queries, a miss in the middle of a chain, pod
// filters that leave nothing, tiers, clearing and capacity.
//
// # Caveats
//
// A Lookup is not a snapshot: with concurrent writers each key is read
// consistently, but the walk may see a pod's later blocks change while it
// runs. Bounded backends forget blocks when full, so a pod may hold more
// than the store reports; they count what they forget.
package store
