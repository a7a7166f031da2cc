// Package events turns the KV cache events that inference servers publish
// over ZeroMQ into typed batches: one Batch per message, holding Events of
// the kinds BlockStored, BlockRemoved and AllBlocksCleared.
//
// # Basics
//
// A message is three frames, [topic, seq, payload]: the topic
// kv@<pod>@<model> (ParseTopic splits it), an 8-byte big-endian sequence
// number, and a msgpack EventBatch. Decode takes the three frames,
// DecodeFrames a whole message including the 4-frame replay replies.
// Both encodings that publishers use are accepted, per batch and per event:
// positional arrays (llm-d-inference-sim's default, vLLM up to v0.23) and
// maps (vLLM from v0.24, the sim with --use-vllm-map-event-format). The
// wire contract is spec/kv-events.md in the shared material beside the
// repository; docs/recordings.md describes the files that package
// events/recording reads and writes.
//
// Decode into the same Batch again and again: it reuses the Batch's memory,
// so a steady stream allocates nothing.
//
//	var b events.Batch
//	for msg := range msgs {
//		if err := events.DecodeFrames(msg, &b); err != nil {
//			// count it by kind: errors.Is(err, events.ErrTruncated), ...
//			continue
//		}
//		for _, e := range b.Events { ... }
//	}
//
// # Caveats
//
//   - A Batch's slices are overwritten by the next Decode into it; copy what
//     must outlive it.
//   - Unknown event types and unknown fields are not errors: they are
//     skipped and counted in Batch.Skipped and Batch.UnknownFields, and
//     named, with a count each, in Batch.SkippedTypes and
//     Batch.UnknownFieldNames: at most MaxUnknownNames distinct names per
//     batch, each cut to MaxUnknownNameBytes bytes and not otherwise
//     checked. Array elements beyond the known positions are named by
//     position ("BlockStored[15]", "batch[3]"). The keys of a map event of
//     unknown type that prefixd does not know count as unknown fields too,
//     since its type may come last. Anything else malformed fails the whole
//     message with an error matching one of the sentinels in errors.go.
//   - Block hashes that arrive as binaries (vLLM with
//     VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) are reduced to their last 8
//     bytes, big-endian, the value vLLM publishes in integer mode. Binaries
//     shorter than 8 bytes and negative integers are rejected (ErrType,
//     ErrRange).
//   - Every field current vLLM publishes is decoded, in both encodings:
//     group_idx, kv_cache_spec_kind (SpecKind), kv_cache_spec_sliding_window,
//     locality, ownership and session_id on BlockStored; group_idx,
//     locality, ownership and remaining_copy_counts on BlockRemoved. Each
//     may be absent or nil. In the map encoding a field is taken on any
//     event type that carries it. remaining_copy_counts is kept as it came:
//     its length is not checked against block_hashes.
//   - Medium, spec kind and locality names are matched ignoring case. A
//     name prefixd does not know decodes as MediumOther, SpecOther or
//     LocalityOther; the name itself is not kept.
//   - ownership and session_id are kept as their bytes came, like
//     lora_name: not checked as UTF-8 (check them with CheckName before
//     showing one), but longer than MaxNameBytes they fail the message with
//     ErrTooLarge. A negative remaining copy count or sliding window fails
//     it with ErrRange. kv_cache_spec_sliding_window is 0 when absent.
package events
