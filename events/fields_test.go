package events

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// Wire names of the positional fields after the tag, as storedFields and
// removedFields order them; the tests build both encodings from these.
var (
	storedWire = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
		"locality", "ownership", "session_id"}
	removedWire = []string{"block_hashes", "medium", "group_idx", "locality", "ownership", "remaining_copy_counts"}
)

// eventForms returns one event of kind with the fields set, by wire name,
// in the array encoding (nil at the positions before the last set field,
// the rest left off, as vLLM omits trailing defaults) and in the map
// encoding (only the fields set).
func eventForms(tb testing.TB, kind string, set omap) (array []any, asMap omap) {
	tb.Helper()
	order := storedWire
	if kind == "BlockRemoved" {
		order = removedWire
	}
	pos := map[string]int{}
	for i, name := range order {
		pos[name] = i
	}
	array = []any{kind}
	asMap = omap{{"type", kind}}
	for _, f := range set {
		i, ok := pos[f.k]
		if !ok {
			tb.Fatalf("%s has no field %s", kind, f.k)
		}
		for len(array) <= i+1 {
			array = append(array, nil)
		}
		array[i+1] = f.v
		asMap = append(asMap, f)
	}
	return array, asMap
}

// TestDecodeNewFields decodes every field current vLLM publishes, set, nil
// and absent, in the array and the map encoding of BlockStored and
// BlockRemoved, and checks that both give the same event.
func TestDecodeNewFields(t *testing.T) {
	toks := tokens(16)
	stored := omap{{"block_hashes", []uint64{h1}}, {"token_ids", toks}, {"block_size", 16}}
	removed := omap{{"block_hashes", []uint64{h2, h3}}}
	baseStored := Event{Kind: KindBlockStored, BlockHashes: []uint64{h1}, TokenIDs: toks, BlockSize: 16}
	baseRemoved := Event{Kind: KindBlockRemoved, BlockHashes: []uint64{h2, h3}}
	long := strings.Repeat("o", MaxNameBytes)

	type tcase struct {
		name string
		kind string
		set  omap
		want func(e *Event)
	}
	tests := []tcase{
		{"stored, no new field", "BlockStored", nil, func(*Event) {}},
		{"removed, no new field", "BlockRemoved", nil, func(*Event) {}},
		{"stored, every new field nil", "BlockStored", omap{{"group_idx", nil}, {"kv_cache_spec_kind", nil},
			{"kv_cache_spec_sliding_window", nil}, {"locality", nil}, {"ownership", nil}, {"session_id", nil}}, func(*Event) {}},
		{"removed, every new field nil", "BlockRemoved", omap{{"medium", nil}, {"group_idx", nil}, {"locality", nil},
			{"ownership", nil}, {"remaining_copy_counts", nil}}, func(*Event) {}},
		{"hybrid sliding-window group", "BlockStored", omap{{"group_idx", 1}, {"kv_cache_spec_kind", "sliding_window"},
			{"kv_cache_spec_sliding_window", 4096}, {"locality", "LOCAL"}},
			func(e *Event) {
				e.GroupIdx, e.HasGroupIdx, e.SpecKind, e.SlidingWindow, e.Locality = 1, true, SpecSlidingWindow, 4096, LocalityLocal
			}},
		{"sliding window of every integer width", "BlockStored", omap{{"kv_cache_spec_sliding_window", width{1 << 40, 8}}},
			func(e *Event) { e.SlidingWindow = 1 << 40 }},
		{"sliding window as int16", "BlockStored", omap{{"kv_cache_spec_sliding_window", signed{1024, 2}}},
			func(e *Event) { e.SlidingWindow = 1024 }},
		{"sliding window 0", "BlockStored", omap{{"kv_cache_spec_sliding_window", 0}}, func(*Event) {}},
		{"kind in upper case", "BlockStored", omap{{"kv_cache_spec_kind", "MLA_Attention"}},
			func(e *Event) { e.SpecKind = SpecMLAAttention }},
		{"kind prefixd does not know", "BlockStored", omap{{"kv_cache_spec_kind", "linear_attention"}},
			func(e *Event) { e.SpecKind = SpecOther }},
		{"empty kind", "BlockStored", omap{{"kv_cache_spec_kind", ""}}, func(e *Event) { e.SpecKind = SpecOther }},
		{"locality in lower case", "BlockStored", omap{{"locality", "remote"}}, func(e *Event) { e.Locality = LocalityRemote }},
		{"locality prefixd does not know", "BlockRemoved", omap{{"locality", "PEER"}}, func(e *Event) { e.Locality = LocalityOther }},
		{"empty locality", "BlockRemoved", omap{{"locality", ""}}, func(e *Event) { e.Locality = LocalityOther }},
		{"stored by an offloading tier", "BlockStored", omap{{"medium", "CPU"}, {"locality", "Local"}, {"ownership", "cpu-offload"},
			{"session_id", "sess-7f3a"}},
			func(e *Event) {
				e.Medium, e.Locality, e.Ownership, e.SessionID = MediumCPU, LocalityLocal, []byte("cpu-offload"), []byte("sess-7f3a")
			}},
		{"ownership and session id as binaries", "BlockStored", omap{{"ownership", []byte("o")}, {"session_id", []byte{0, 1, 2}}},
			func(e *Event) { e.Ownership, e.SessionID = []byte("o"), []byte{0, 1, 2} }},
		// Like lora_name, names are kept as they came: not UTF-8, control
		// characters and all. The indexer checks them before use.
		{"ownership not UTF-8", "BlockRemoved", omap{{"ownership", "\xff\xfe\x00tier"}},
			func(e *Event) { e.Ownership = []byte("\xff\xfe\x00tier") }},
		{"session id not UTF-8", "BlockStored", omap{{"session_id", "s\xc3"}}, func(e *Event) { e.SessionID = []byte("s\xc3") }},
		{"empty ownership", "BlockRemoved", omap{{"ownership", ""}}, func(*Event) {}},
		{"names of the longest length", "BlockStored", omap{{"ownership", long}, {"session_id", long}},
			func(e *Event) { e.Ownership, e.SessionID = []byte(long), []byte(long) }},
		{"remaining copies", "BlockRemoved", omap{{"medium", "STORAGE"}, {"group_idx", 0}, {"locality", "REMOTE"},
			{"ownership", "nixl"}, {"remaining_copy_counts", []any{0, 2}}},
			func(e *Event) {
				e.Medium, e.HasGroupIdx, e.Locality, e.Ownership, e.RemainingCopies = MediumStorage, true, LocalityRemote, []byte("nixl"), []uint64{0, 2}
			}},
		// The indexer, not the decoder, decides what a count list of
		// another length than block_hashes means.
		{"remaining copies of every width, more than hashes", "BlockRemoved",
			omap{{"remaining_copy_counts", []any{compact(300), width{7, 1}, width{70000, 4}, width{math.MaxUint64, 8}, signed{5, 2}}}},
			func(e *Event) { e.RemainingCopies = []uint64{300, 7, 70000, math.MaxUint64, 5} }},
		{"empty remaining copies", "BlockRemoved", omap{{"remaining_copy_counts", []any{}}}, func(*Event) {}},
		{"medium STORAGE", "BlockStored", omap{{"medium", "storage"}}, func(e *Event) { e.Medium = MediumStorage }},
		{"medium FS", "BlockRemoved", omap{{"medium", "FS"}}, func(e *Event) { e.Medium = MediumFS }},
		{"medium OBJ", "BlockRemoved", omap{{"medium", "Obj"}}, func(e *Event) { e.Medium = MediumOBJ }},
		{"medium prefixd does not know", "BlockStored", omap{{"medium", "HBM3"}}, func(e *Event) { e.Medium = MediumOther }},
	}
	for k := SpecFullAttention; k <= SpecUnknown; k++ {
		tests = append(tests, tcase{"kind " + k.String(), "BlockStored", omap{{"kv_cache_spec_kind", k.String()}},
			func(e *Event) { e.SpecKind = k }})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, want := stored, baseStored
			if tt.kind == "BlockRemoved" {
				base, want = removed, baseRemoved
			}
			tt.want(&want)
			array, asMap := eventForms(t, tt.kind, append(append(omap(nil), base...), tt.set...))
			for form, ev := range map[string]any{"array": array, "map": asMap} {
				payload := pack(t, []any{1.0, []any{ev}})
				var b Batch
				if err := Decode(testTopic, seqFrame(1), payload, &b); err != nil {
					t.Fatalf("%s: %v", form, err)
				}
				exp := Batch{Topic: testTopic, Seq: 1, TS: 1, Events: []Event{want}}
				if d := diffBatch(&b, &exp); d != "" {
					t.Errorf("%s: differs in %s", form, d)
				}
			}
		})
	}
}

func TestDecodeNewFieldErrors(t *testing.T) {
	over := strings.Repeat("o", MaxNameBytes+1)
	tests := []struct {
		name  string
		kind  string
		set   omap
		err   error
		field string
	}{
		{"ownership of 257 bytes", "BlockStored", omap{{"ownership", over}}, ErrTooLarge, "ownership"},
		{"ownership binary of 257 bytes", "BlockRemoved", omap{{"ownership", []byte(over)}}, ErrTooLarge, "ownership"},
		{"session id of 257 bytes", "BlockStored", omap{{"session_id", over}}, ErrTooLarge, "session_id"},
		{"session id of 64 KiB", "BlockStored", omap{{"session_id", strings.Repeat("s", 1<<16)}}, ErrTooLarge, "session_id"},
		{"ownership is an integer", "BlockRemoved", omap{{"ownership", 1}}, ErrType, "ownership"},
		{"session id is an array", "BlockStored", omap{{"session_id", []any{"s"}}}, ErrType, "session_id"},
		{"negative remaining copies", "BlockRemoved", omap{{"remaining_copy_counts", []any{1, signed{-1, 1}}}}, ErrRange, "remaining_copy_counts[1]"},
		{"negative int64 remaining copies", "BlockRemoved", omap{{"remaining_copy_counts", []any{signed{math.MinInt64, 8}}}}, ErrRange, "remaining_copy_counts[0]"},
		{"remaining copy is a string", "BlockRemoved", omap{{"remaining_copy_counts", []any{"1"}}}, ErrType, "remaining_copy_counts[0]"},
		{"remaining copy is nil", "BlockRemoved", omap{{"remaining_copy_counts", []any{nil}}}, ErrType, "remaining_copy_counts[0]"},
		{"remaining copies is a map", "BlockRemoved", omap{{"remaining_copy_counts", omap{}}}, ErrType, "remaining_copy_counts"},
		{"remaining copies claiming 2^32-1", "BlockRemoved", omap{{"remaining_copy_counts", raw{0xdd, 0xff, 0xff, 0xff, 0xff}}}, ErrTooLarge, "remaining_copy_counts"},
		{"negative sliding window", "BlockStored", omap{{"kv_cache_spec_sliding_window", -1}}, ErrRange, "kv_cache_spec_sliding_window"},
		{"sliding window above 2^63-1", "BlockStored", omap{{"kv_cache_spec_sliding_window", uint64(math.MaxUint64)}}, ErrRange, "kv_cache_spec_sliding_window"},
		{"sliding window is a string", "BlockStored", omap{{"kv_cache_spec_sliding_window", "4096"}}, ErrType, "kv_cache_spec_sliding_window"},
		{"kind is an integer", "BlockStored", omap{{"kv_cache_spec_kind", 3}}, ErrType, "kv_cache_spec_kind"},
		{"locality is a bool", "BlockRemoved", omap{{"locality", true}}, ErrType, "locality"},
		{"locality is a binary", "BlockRemoved", omap{{"locality", []byte("LOCAL")}}, ErrType, "locality"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			array, asMap := eventForms(t, tt.kind, append(omap{{"block_hashes", []uint64{h1}}}, tt.set...))
			for form, ev := range map[string]any{"array": array, "map": asMap} {
				var b Batch
				err := Decode(testTopic, seqFrame(1), pack(t, []any{1.0, []any{[]any{"AllBlocksCleared"}, ev}}), &b)
				if !errors.Is(err, tt.err) {
					t.Fatalf("%s: err = %v, want %v", form, err, tt.err)
				}
				var de *DecodeError
				if !errors.As(err, &de) || de.Field != "events[1]."+tt.field || de.Want == "" || de.Got == "" {
					t.Errorf("%s: error %v does not name events[1].%s with what was expected and what came", form, err, tt.field)
				}
			}
		})
	}
}

// TestDecodeUnknownNames checks that the names of unknown event types and
// fields are kept, counted, cut and capped, and that a used batch forgets
// the names of its earlier decode.
func TestDecodeUnknownNames(t *testing.T) {
	long := strings.Repeat("x", 100)
	// 63 ASCII bytes then a 2-byte rune across the 64-byte cut.
	utf := strings.Repeat("a", MaxUnknownNameBytes-1) + "é" + "tail"
	var evs []any
	for i := range 10 { // ten distinct unknown types, the first thrice
		for range map[bool]int{true: 3, false: 1}[i == 0] {
			evs = append(evs, []any{"BlockInactive" + strconv.Itoa(i), []uint64{h1}})
		}
	}
	evs = append(evs,
		omap{{"type", long + "1"}, {"x", 1}}, // counted, not kept: the list is full
		[]any{"AllBlocksCleared"},
	)
	types := pack(t, []any{1.0, evs})
	wantTypes := names("BlockInactive0", 3, "BlockInactive1", 1, "BlockInactive2", 1, "BlockInactive3", 1,
		"BlockInactive4", 1, "BlockInactive5", 1, "BlockInactive6", 1, "BlockInactive7", 1)

	fields := pack(t, omap{{"ts", 1.0}, {long + "a", 1}, {"events", []any{
		omap{{"type", "BlockInactive"}, {"block_hashes", []uint64{h1}}},
		omap{{"type", "BlockStored"}, {"block_hashes", []uint64{h1}}, {"event_version", 2}, {long + "b", nil}, {utf, 1}},
		[]any{"BlockStored", nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, "new", "newer"},
		[]any{"BlockRemoved", nil, nil, nil, nil, nil, nil, 1},
		[]any{"AllBlocksCleared", 1, 2},
		omap{{"type", "AllBlocksCleared"}, {"event_version", 2}, {"f1", 1}, {"f2", 2}},
		omap{{"block_hashes", []uint64{h1}}},
	}}, {"producer", "x"}})
	// long+"a" and long+"b" share their first 64 bytes: one name, twice.
	// The fields of a map event of unknown type are counted too.
	wantFields := names(long[:MaxUnknownNameBytes], 2, "event_version", 2, utf[:MaxUnknownNameBytes-1], 1,
		"BlockStored[15]", 1, "BlockStored[16]", 1, "BlockRemoved[7]", 1, "AllBlocksCleared[1]", 1, "AllBlocksCleared[2]", 1)

	check := func(t *testing.T, b *Batch, skipped int, st []NameCount, unknown int, uf []NameCount) {
		t.Helper()
		if b.Skipped != skipped || !equalNames(b.SkippedTypes, st) {
			t.Errorf("skipped %d %s, want %d %s", b.Skipped, fmtNames(b.SkippedTypes), skipped, fmtNames(st))
		}
		if b.UnknownFields != unknown || !equalNames(b.UnknownFieldNames, uf) {
			t.Errorf("unknown fields %d %s, want %d %s", b.UnknownFields, fmtNames(b.UnknownFieldNames), unknown, fmtNames(uf))
		}
		for _, l := range [][]NameCount{b.SkippedTypes, b.UnknownFieldNames} {
			if len(l) > MaxUnknownNames {
				t.Errorf("%d names kept", len(l))
			}
			for _, n := range l {
				if len(n.Name) > MaxUnknownNameBytes {
					t.Errorf("name of %d bytes kept", len(n.Name))
				}
			}
		}
	}
	var b Batch
	for range 2 { // the second round decodes into a batch that held names
		if err := Decode(testTopic, seqFrame(1), types, &b); err != nil {
			t.Fatal(err)
		}
		check(t, &b, 13, wantTypes, 1, names("x", 1))
		if len(b.Events) != 1 || b.Events[0].Kind != KindAllBlocksCleared {
			t.Errorf("events %+v", b.Events)
		}
		if err := Decode(testTopic, seqFrame(2), fields, &b); err != nil {
			t.Fatal(err)
		}
		check(t, &b, 2, names("BlockInactive", 1, NoTypeName, 1), 13, wantFields)
		if err := Decode(testTopic, seqFrame(3), benchBatch(t, 1, 1, true), &b); err != nil {
			t.Fatal(err)
		}
		check(t, &b, 0, nil, 0, nil)
	}
}

func TestCutName(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), strings.Repeat("a", 64)},
		{strings.Repeat("a", 62) + "€x", strings.Repeat("a", 62)},       // 3-byte rune at 62..64
		{strings.Repeat("a", 61) + "𝄞x", strings.Repeat("a", 61)},       // 4-byte rune at 61..64
		{strings.Repeat("a", 60) + "𝄞x", strings.Repeat("a", 60) + "𝄞"}, // ends at 64
		{strings.Repeat("\x80", 70), strings.Repeat("\x80", 64)},        // no rune start: cut at 64
	} {
		if got := cutName([]byte(tt.in)); string(got) != tt.want {
			t.Errorf("cutName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseSpecKind(t *testing.T) {
	for k := SpecFullAttention; k <= SpecUnknown; k++ {
		for _, name := range []string{k.String(), strings.ToUpper(k.String())} {
			if got := ParseSpecKind([]byte(name)); got != k {
				t.Errorf("ParseSpecKind(%q) = %v, want %v", name, got, k)
			}
		}
	}
	for _, name := range []string{"", "other", "full", "full_attention ", "ſliding_window", "linear_attention"} {
		if got := ParseSpecKind([]byte(name)); got != SpecOther {
			t.Errorf("ParseSpecKind(%q) = %v, want SpecOther", name, got)
		}
	}
	if !SpecMLAAttention.FullAttention() || SpecSlidingWindow.FullAttention() || SpecOther.FullAttention() {
		t.Error("FullAttention is wrong")
	}
	if SpecNone.String() != "" || SpecKind(200).String() != "other" {
		t.Error("SpecKind.String is wrong")
	}
	name := []byte("Chunked_Local_Attention")
	if n := testing.AllocsPerRun(10, func() { ParseSpecKind(name) }); n != 0 {
		t.Errorf("ParseSpecKind allocates %v times", n)
	}
}

func TestParseLocality(t *testing.T) {
	for name, want := range map[string]Locality{
		"LOCAL": LocalityLocal, "local": LocalityLocal, "Remote": LocalityRemote, "REMOTE": LocalityRemote,
		"": LocalityOther, "LOCALE": LocalityOther, "peer": LocalityOther,
	} {
		if got := ParseLocality([]byte(name)); got != want {
			t.Errorf("ParseLocality(%q) = %v, want %v", name, got, want)
		}
	}
	if LocalityNone.String() != "" || LocalityOther.String() != "OTHER" || Locality(9).String() != "OTHER" {
		t.Error("Locality.String is wrong")
	}
}

// TestNewFieldsReuseMemory decodes events with every new field, then
// without them, into one Batch: nothing of the first decode may remain,
// and the second pass allocates nothing.
func TestNewFieldsReuseMemory(t *testing.T) {
	full := pack(t, []any{1.0, []any{
		[]any{"BlockStored", []uint64{h1}, nil, tokens(16), 16, nil, "GPU", nil, nil, 1, "mamba", 8, "LOCAL", "tier-a", "session-a"},
		omap{{"type", "BlockRemoved"}, {"block_hashes", []uint64{h1, h2}}, {"locality", "REMOTE"}, {"ownership", "tier-b"},
			{"remaining_copy_counts", []any{1, 0}}},
		[]any{"BlockInactive", 1},
		omap{{"type", "AllBlocksCleared"}, {"tier", 1}},
	}})
	bare := pack(t, []any{1.0, []any{
		[]any{"BlockStored", []uint64{h1}, nil, tokens(16), 16},
		[]any{"BlockRemoved", []uint64{h1, h2}},
	}})
	var b Batch
	payloads, seq := [][]byte{full, bare}, seqFrame(1)
	for range 2 {
		for _, p := range payloads {
			if err := Decode(testTopic, seqFrame(1), p, &b); err != nil {
				t.Fatal(err)
			}
			var fresh Batch
			if err := Decode(testTopic, seqFrame(1), bytes.Clone(p), &fresh); err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(&b, &fresh); d != "" {
				t.Fatalf("decode into a used batch differs from a fresh one in %s", d)
			}
		}
	}
	if raceEnabled {
		return
	}
	if n := testing.AllocsPerRun(20, func() {
		for _, p := range payloads {
			if err := Decode(testTopic, seq, p, &b); err != nil {
				t.Fatal(err)
			}
		}
	}); n != 0 {
		t.Errorf("%v allocations per decode into a used batch, want 0", n)
	}
}

func TestFieldByName(t *testing.T) {
	for f := fBlockHashes; int(f) < len(fieldNames); f++ {
		name := fieldNames[f]
		if got := fieldByName([]byte(name)); got != f {
			t.Errorf("fieldByName(%q) = %d, want %d", name, got, f)
		}
		// Same length and first byte, another name; one byte short or long.
		other := []byte(name)
		other[len(other)-1] ^= 0x20
		for _, k := range [][]byte{other, []byte(name[:len(name)-1]), []byte(name + "s"), bytes.ToUpper([]byte(name))} {
			if got := fieldByName(k); got != fUnknown {
				t.Errorf("fieldByName(%q) = %d, want unknown", k, got)
			}
		}
	}
	for _, k := range []string{"", "type", "unknown", "event_version", "tokenXids", "xxxxxxxxx", "xxxxxxxxxx"} {
		if got := fieldByName([]byte(k)); got != fUnknown {
			t.Errorf("fieldByName(%q) = %d, want unknown", k, got)
		}
	}
}
