// Package redis is the block index kept in Redis, a store.Store that
// several prefixd processes share: one redis-server (redis://,
// rediss://) or a Redis Cluster (redis-cluster://).
//
// # Basics
//
//	s, err := redis.New(ctx, redis.Options{URL: "redis://10.0.0.9:6379/0", Registerer: reg})
//	defer s.Close()
//	res, err := s.Apply(ctx, "10.0.0.7:8000", &store.Batch{Seq: seq, Ops: ops})
//	matches, err := s.Lookup(ctx, queryKeys, nil, matches)
//	err = s.Ping(ctx) // for /readyz
//
// Every key starts with Options.Prefix ("prefixd:"), so that fleets share
// a Redis. A block is a hash, <prefix>b:<16 hex digits of its key>, from
// pod id to tier mask; pods have small integer ids (<prefix>podid) so
// that those fields are short. What the store keeps of a pod (the keys it
// holds, in 256 intset buckets; its engine-hash map; its applied seq,
// stale mark and block count; its write lease) is under one hash tag,
// {<prefix>p:<pod>}, in one cluster slot. docs/redis.md has the layout
// and the reasons for it.
//
// A pod's batches are applied by one process at a time: the holder of the
// pod's write lease, which Apply takes when it is free (or its own) and
// refreshes on every batch, and which lapses LeaseTTL after its holder's
// last batch. Another process's Apply (and ForgetPod) of the pod returns
// an error wrapping store.ErrNotOwner and changes nothing. On a single
// node Apply is one Lua script: lease, seq fence, ops, applied seq. On a
// cluster a batch's blocks span slots and nodes, so it takes three steps
// under the lease: the pod's slot (lease, fence, membership of what it
// adds), the blocks' nodes (one pipeline per node, in parallel, each
// block's new mask), the pod's slot again (the applied seq, only if the
// lease is still this process's). A failure between steps leaves the
// applied seq where it was, and the batch applies again from there to
// the same end.
//
// A lookup on a single node is one Lua script that walks the query and
// stops at the first key no candidate holds. On a cluster the query's
// keys are read in one pipeline per node, in parallel, and walked here;
// the matched pods' stale marks take one more round trip.
//
// Every call is bounded by its context's deadline or, when that is later
// or absent, Options.Timeout; the client's dial, read and write timeouts
// are that timeout too. Errors of a Redis that cannot be reached, does
// not answer in time or is failing over (LOADING, CLUSTERDOWN, TRYAGAIN,
// MASTERDOWN, READONLY, BUSY) wrap store.ErrUnavailable. Nothing is
// retried inside the store: the caller applies a failed batch again (it
// is idempotent), and a lookup that failed is better answered "no match"
// at once than late. prefixd_store_redis_call_seconds{op} and
// prefixd_store_redis_errors_total{op,reason} count the calls.
//
// # Load
//
// On the loopback of a 2-core VM (BenchmarkRedis*, figures in
// docs/redis.md): a lookup of a 512-block prompt in an index of 1Mi
// blocks over 100 pods takes 1.3 to 1.4 ms at the median and about 3 ms
// at the 99th percentile, most of it the script's one HGET a block;
// stores and removals run at 80k to 165k blocks/s (batches of 16 to
// 128), the server's one thread being the limit; a (pod, block) holding
// costs 131 bytes of Redis memory (187 with a BlockTTL), and 1Mi of them
// load in 6 to 9 s.
//
// # Caveats
//
//   - ForgetPod takes the pod's lease like Apply and returns an error
//     wrapping store.ErrNotOwner when another process holds it: that
//     process applies the pod's events, and forgets it itself when its
//     engine restarts or it leaves; a process whose lease lapsed can
//     forget it. (Forgetting a pod some other replica is still applying
//     would undo that replica's newer batches.) SetStale takes no lease.
//   - On a single node the lease is checked in the batch's script, so
//     two processes never interleave a pod's batches. On a cluster it
//     bounds that only while the holder is not paused for longer than
//     LeaseTTL in the middle of a batch (a GC pause, a stopped VM): then
//     another process may take the lease and apply the pod's next
//     batches, and the first's late block writes may land after them,
//     leaving a block held (or not) wrongly until it is next stored or
//     removed. The first's last step fails (ErrNotOwner) and does not
//     move the seq. Keep LeaseTTL well above such pauses.
//   - An OpClear on a single node runs in the batch's script, which keeps
//     the batch atomic but keeps the server busy for about 6 µs a block
//     of the pod: 0.6 s for a pod of 100k blocks, during which no other
//     command runs. ForgetPod works 2048 blocks a script (about 15 ms).
//   - BlockTTL is per block key: a block any pod stores again stays, with
//     all its holders. A pod's membership entries of blocks that expired
//     are dropped by Pods, which checks a pod's whole membership once per
//     BlockTTL (on a cluster, pods whose lease another process holds are
//     left to that process's Pods); until then Pods counts them. ForgetPod
//     and OpClear are right regardless: deleting a holding that expired
//     does nothing.
//   - A pod's membership buckets are intsets while they hold at most
//     set-max-intset-entries (512 by default) keys, that is up to about
//     130k blocks a pod; beyond, Redis turns them into hash tables of
//     about 50 more bytes a block. Raise set-max-intset-entries on the
//     server for pods that hold more.
//   - Pod ids are cached by each process. If the server loses its data
//     (a restart without persistence, a failover to a replica behind),
//     a pod's next batch notices that its id changed and the cache is
//     dropped; until every process has, a cluster's lookups may name the
//     wrong pod for a moved id. Run Redis with persistence and replicas
//     that keep up.
//   - go-redis logs a few events (failed dials) through its own global
//     logger; goredis.SetLogger in main routes or silences them.
package redis
