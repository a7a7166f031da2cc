package indexer

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/prefixd/prefixd/events"
	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/internal/fixture"
	"github.com/prefixd/prefixd/store"
	"github.com/prefixd/prefixd/store/memory"
)

// recordingFiles returns the event files of a recording directory: for c,
// the part files (with gaps) and the complete replays.
func recordingFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	for _, pat := range []string{"events*.jsonl", "replay-*-from-0.jsonl"} {
		m, err := filepath.Glob(filepath.Join(fixture.SimDir(t), dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			if !regexp.MustCompile(`decoded`).MatchString(f) {
				files = append(files, f)
			}
		}
	}
	if len(files) == 0 {
		t.Fatalf("%s: no event files", dir)
	}
	return files
}

// seedOf reads --hash-seed from a recording's cmdline.txt ("" when absent).
func seedOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(fixture.Path(t, dir, "cmdline.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`--hash-seed (\S+)`).FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return ""
}

// reference is the index the spec's semantics give: per pod, the engine
// hashes it holds, and which of them tokens mode cannot key right.
type reference struct {
	blocks map[string]map[uint64]bool
	// affected: stored by an event that does not continue its parent, or
	// chained from such a block: a chain re-computed from token_ids differs.
	affected      map[string]map[uint64]bool
	nonContiguous int
}

func buildReference(t *testing.T, rec *Recorded, h *blockhash.Hasher, model string) *reference {
	t.Helper()
	ref := &reference{blocks: map[string]map[uint64]bool{}, affected: map[string]map[uint64]bool{}}
	for pod, batches := range rec.Pods {
		held, bad := map[uint64]bool{}, map[uint64]bool{}
		ref.blocks[pod], ref.affected[pod] = held, bad
		for _, b := range batches {
			for _, e := range b.Events {
				switch e.Kind {
				case events.KindBlockStored:
					var want []uint64
					var err error
					if e.HasParent {
						want, err = h.AppendChain(nil, e.ParentHash, e.TokenIDs)
					} else {
						want, err = h.AppendPrompt(nil, e.TokenIDs, blockhash.Prompt{Model: model})
					}
					if err != nil {
						t.Fatal(err)
					}
					broken := !slices.Equal(want, e.BlockHashes) || (e.HasParent && bad[e.ParentHash])
					if !slices.Equal(want, e.BlockHashes) {
						ref.nonContiguous++
					}
					for _, x := range e.BlockHashes {
						held[x] = true
						if broken {
							bad[x] = true
						} else {
							delete(bad, x)
						}
					}
				case events.KindBlockRemoved:
					for _, x := range e.BlockHashes {
						delete(held, x)
					}
				case events.KindAllBlocksCleared:
					clear(held)
				}
			}
		}
	}
	return ref
}

// ownKeys maps the engine hash of every block stored by an event that
// continues its parent to the key of the same block in prefixd's own chain,
// computed over the block's whole prefix of tokens.
func ownKeys(t *testing.T, rec *Recorded, engine, own *blockhash.Hasher, model string) map[uint64]uint64 {
	t.Helper()
	prefix := map[uint64][]uint32{}
	out := map[uint64]uint64{}
	for _, batches := range rec.Pods {
		for _, b := range batches {
			for _, e := range b.Events {
				if e.Kind != events.KindBlockStored {
					continue
				}
				var toks []uint32
				if e.HasParent {
					p, ok := prefix[e.ParentHash]
					if !ok {
						continue
					}
					toks = slices.Clone(p)
				}
				if want, _ := engine.AppendChain(nil, mustRoot(t, engine, e.HasParent, e.ParentHash, model), e.TokenIDs); !slices.Equal(want, e.BlockHashes) {
					continue // does not continue its parent: no prefix to learn
				}
				for i, h := range e.BlockHashes {
					toks = append(toks, e.TokenIDs[i*16:(i+1)*16]...)
					keys, err := own.AppendPrompt(nil, toks, blockhash.Prompt{Model: model})
					if err != nil {
						t.Fatal(err)
					}
					if _, seen := prefix[h]; !seen {
						prefix[h] = slices.Clone(toks)
					}
					out[h] = keys[len(keys)-1]
				}
			}
		}
	}
	return out
}

// readRequests returns the chat requests recorded in dir.
func readRequests(t *testing.T, dir string) []tokenize.ChatRequest {
	t.Helper()
	var out []tokenize.ChatRequest
	for _, r := range fixture.Requests(t, dir) {
		req, err := tokenize.ParseChat(r.Body)
		if err != nil {
			t.Fatalf("%s:%d: %v", r.File, r.Line, err)
		}
		out = append(out, req)
	}
	return out
}

func newMemoryIndexer(t *testing.T, mo ModelOptions) (*Indexer, *memory.Store) {
	t.Helper()
	st, err := memory.New(memory.Options{CapacityBlocks: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Default = mo
	ix, err := New(st, opts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ix, st
}

// holds reports whether pod holds key in st.
func holds(t *testing.T, st store.Store, pod string, key uint64) bool {
	t.Helper()
	m, err := st.Lookup(context.Background(), []uint64{key}, []string{pod}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return len(m) == 1 && m[0].Blocks == 1
}

func podCounts(t *testing.T, st store.Store) map[string]int {
	t.Helper()
	infos, err := st.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, in := range infos {
		out[in.Name] = in.Blocks
	}
	return out
}

// TestRecordingsMatchReference replays every recording in engine, tokens
// and auto key modes and checks the final per-pod block sets against the
// reference built from the spec's semantics.
func TestRecordingsMatchReference(t *testing.T) {
	const model = "sim-model"
	for _, dir := range fixture.Recordings {
		t.Run(dir, func(t *testing.T) {
			seed := seedOf(t, dir)
			rec, err := ReadRecordings(recordingFiles(t, dir), model)
			if err != nil {
				t.Fatal(err)
			}
			base := ModelOptions{HashScheme: "llmd", HashSeed: seed, BlockSize: 16}
			engine, own, err := newHashers(base)
			if err != nil {
				t.Fatal(err)
			}
			ref := buildReference(t, rec, engine, model)
			for _, mode := range []KeyMode{KeyModeEngine, KeyModeTokens, KeyModeAuto} {
				t.Run(mode.String(), func(t *testing.T) {
					mo := base
					mo.KeyMode = mode
					ix, st := newMemoryIndexer(t, mo)
					if _, err := ix.ApplyRecorded(context.Background(), rec); err != nil {
						t.Fatal(err)
					}
					counts := podCounts(t, st)
					got := ix.KeyMode(model)
					if mode == KeyModeAuto && got != KeyModeEngine {
						t.Fatalf("auto chose %v, want engine", got)
					}
					if got == KeyModeEngine {
						for pod, held := range ref.blocks {
							if counts[pod] != len(held) {
								t.Errorf("pod %s holds %d blocks, reference %d", pod, counts[pod], len(held))
							}
							for h := range held {
								if !holds(t, st, pod, h) {
									t.Errorf("pod %s lacks block %d", pod, h)
								}
							}
						}
						checkQueries(t, ix, dir, ref, engine, model)
						return
					}
					// Tokens mode: keys are prefixd's own chain; blocks that
					// an event listed without continuing its parent (and
					// their descendants) get other keys, and only those.
					keys := ownKeys(t, rec, engine, own, model)
					allowed := 0
					for pod, held := range ref.blocks {
						allowed += len(ref.affected[pod])
						for h := range held {
							if ref.affected[pod][h] {
								continue
							}
							k, ok := keys[h]
							if !ok {
								t.Fatalf("block %d of pod %s: no prefix known", h, pod)
							}
							if !holds(t, st, pod, k) {
								t.Errorf("pod %s lacks own key of block %d", pod, h)
							}
						}
						if d := len(held) - counts[pod]; d < 0 || d > len(ref.affected[pod]) {
							t.Errorf("pod %s holds %d blocks, reference %d with %d affected by non-contiguous events", pod, counts[pod], len(held), len(ref.affected[pod]))
						}
					}
					t.Logf("%d blocks differ from the reference only because of %d non-contiguous events", allowed, ref.nonContiguous)
				})
			}
		})
	}
}

// mustRoot returns the parent an event's first block continues.
func mustRoot(t *testing.T, h *blockhash.Hasher, hasParent bool, parent uint64, model string) uint64 {
	t.Helper()
	if hasParent {
		return parent
	}
	r, err := h.Root(model, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkQueries answers every recorded request and compares each pod's
// matched prefix with the longest run of the prompt's blocks the reference
// says it holds.
func checkQueries(t *testing.T, ix *Indexer, dir string, ref *reference, engine *blockhash.Hasher, model string) {
	t.Helper()
	queries, hits := 0, 0
	for _, req := range readRequests(t, dir) {
		var tk tokenize.Tokenizer
		toks := tk.AppendChat(nil, req.Messages)
		keys, _ := engine.AppendPrompt(nil, toks, blockhash.Prompt{Model: model})
		want := map[string]int{}
		for pod, held := range ref.blocks {
			n := 0
			for n < len(keys) && held[keys[n]] {
				n++
			}
			if n > 0 {
				want[pod] = n
			}
		}
		res, err := ix.Match(context.Background(), &Query{Model: req.Model, Messages: req.Messages})
		if err != nil {
			t.Fatal(err)
		}
		if res.TotalBlocks != len(keys) || res.Tokens != len(toks) {
			t.Fatalf("total blocks %d tokens %d, want %d and %d", res.TotalBlocks, res.Tokens, len(keys), len(toks))
		}
		got := map[string]int{}
		for _, pm := range res.Pods {
			got[pm.Pod] = pm.Blocks
			if pm.Tokens != pm.Blocks*16 || pm.Score != float64(pm.Blocks)/float64(len(keys)) {
				t.Errorf("pod %s: %d blocks, %d tokens, score %v", pm.Pod, pm.Blocks, pm.Tokens, pm.Score)
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("query %d: got %v, reference %v", queries, got, want)
		}
		queries++
		if len(want) > 0 {
			hits++
		}
	}
	t.Logf("%d queries, %d with a match", queries, hits)
}
