// Package ingest is the live path from a transport.Subscriber's queue into
// an indexer.Indexer: it decodes each message, tracks every pod's sequence
// numbers, repairs gaps from the publisher's replay endpoint, and applies
// each pod's batches in publish order, pods in parallel.
//
// # Basics
//
//	p, err := ingest.New(ix, sub, ingest.Options{Sources: srcs}, ingest.NewMetrics(reg))
//	go sub.Run(ctx)
//	err = p.Run(ctx, sub.Messages()) // until the queue closes, ctx ends or Close
//
// Run hands each message to one of a fixed set of workers, chosen by the
// pod the message's topic names (kv@<pod>@<model>) or, for topics that name
// none, by the message's source and peer. A pod is therefore always served
// by the same worker, which decodes, checks the sequence number and
// applies, so one pod's batches are applied in order by one goroutine while
// different pods proceed in parallel. Worker queues are bounded: when one
// is full Run waits, the subscriber's queue fills, and the subscriber drops
// and counts (prefixd_ingest_dropped_total) and flags the next message of
// that connection with Resync.
//
// Per pod, with applied the seq through which the store has its batches
// (read from the store when the pod is first seen, so that a restarted
// prefixd or another replica resumes where the store is):
//   - a pod without history takes its first batch as its publisher's
//     first when its seq is 0 (vLLM) or 1 (llm-d-inference-sim); later
//     than that, what came before is a gap from the publisher's first seq,
//     asked of its replay endpoint, and without one the pod is stale;
//   - seq == applied+1 is applied;
//   - seq == applied is a duplicate, dropped and counted
//     (prefixd_batches_duplicate_total);
//   - seq < applied means the engine restarted (its seq went backwards):
//     the pod is Reset, and the batch is a first batch
//     (prefixd_resets_total);
//   - seq > applied+1 is a gap (prefixd_gaps_total): the batches in
//     between are requested from the replay endpoint and applied in
//     order, then the current one (prefixd_replays_total with result ok,
//     incomplete or error); without one (result unavailable), or when the
//     replay fails or comes back incomplete, the current batch is applied
//     anyway and the pod marked stale. A later replay that fills its gap
//     completely, or a reset, clears the mark.
//   - A message with Resync set (the subscriber dropped messages of its
//     connection before it) is handled as a gap even when its seq is
//     contiguous: what was dropped may have hidden a restart.
//   - A batch the store fails to apply is a gap too: applied again from
//     the store's applied seq, by replay, at once (prefixd_apply_errors_total).
//
// A connection that closes (transport.Message.Closed) makes its pods
// stale: publishers drop what they publish while no subscriber is
// connected. A pod's next batch continuing its seq shows nothing was lost
// and clears the mark; a gap is repaired as above. A pod whose connection
// does not come back within Options.PodTimeout leaves the index with its
// blocks and series (prefixd_pods_removed_total{reason="timeout"}).
//
// Messages that do not decode are counted in
// prefixd_decode_errors_total{source} and skipped.
//
// RemoveSource is for an endpoint that left the fleet: every pod last seen
// from it is removed from the index with its blocks (indexer.RemovePod),
// its seq tracking and its per-pod series are forgotten, each worker doing
// so for its own pods. The source's messages still queued, or arriving
// later, are dropped and counted in
// prefixd_ingest_dropped_total{reason="source_removed"} until SetSource
// takes it again, when its pods start anew.
//
// # Caveats
//
//   - A replay runs on the worker of the pod that needs it, so the other
//     pods of that worker wait for it (at most Options.ReplayTimeout).
//   - A replay endpoint that serves several pods (one publisher, several
//     topics) is fine when replies carry topics: replies of other pods are
//     ignored. Replies without a topic (vLLM <= 0.25) are taken to be the
//     pod's own.
//   - Pods without a kv@ topic are named by the configured Source name, or
//     by the connect endpoint, or for publishers that connected to a bound
//     address by their peer address, which changes when they reconnect.
//   - When Run ends because its context was cancelled, queued messages are
//     discarded; when the input closes or Close is called, they are applied
//     first.
//   - RemoveSource removes a pod by the source it was last seen from: a pod
//     whose batches reach prefixd from two sources goes with the one that
//     delivered its last batch. A removed source's name is kept until
//     SetSource takes it again, so that its late messages are dropped; a
//     source set again before its old messages left the queue has them
//     applied to its new pods.
//     After Run has returned, RemoveSource forgets no pods.
package ingest
