// Package recording reads and writes files of KV event messages exactly as
// subscribers received them: every frame verbatim, with its receive time,
// its source endpoint and whether it was a replay reply.
//
// # Basics
//
// Two formats, both described in docs/recordings.md:
//   - native, written by Writer (`prefixd record`): a magic header, then
//     length-prefixed, checksummed binary records. Append-only, compact,
//     and safe to read while it is being written.
//   - JSONL, the format of the shared fixture recordings: one JSON object
//     per line with the frames in base64 (frames_b64). Read only.
//
// Open tells them apart by their first bytes:
//
//	r, err := recording.Open(path)
//	if err != nil { ... }
//	defer r.Close()
//	for m, err := range r.All() {
//		if err != nil { ... } // a bad record; see Next for which errors end reading
//		events.Decode(m.Topic, m.Seq, m.Payload, &batch)
//	}
//
// Every message is normalised to a Message whose Topic, Seq and Payload are
// views of its frames, whatever the shape it arrived in: live
// [topic, seq, payload], replay ["", topic, seq, payload], replay of vLLM
// <= 0.25 ["", seq, payload] or [seq, payload]. Replay end markers are
// skipped and counted in Stats.
//
// # Caveats
//
//   - A live message with an empty topic and a replay reply of vLLM <= 0.25
//     have the same three frames. The native format records which it was;
//     JSONL says so only with an optional "replay" field, and without it the
//     message is taken as live.
//   - The file ending inside a record (ErrTornTail) is normal for a file
//     being written; Next resumes there once more bytes arrive. A damaged
//     record inside a native file (ErrCorrupt) ends reading: the framing
//     after it cannot be trusted.
//   - Each Message owns fresh memory; reading allocates per message.
//   - A Writer buffers: readers see records after Flush, possibly the last
//     one torn until the next Flush completes it.
//   - This package knows frames, not msgpack: package events decodes payloads.
package recording
