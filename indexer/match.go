package indexer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/prefixd/prefixd/indexer/blockhash"
	"github.com/prefixd/prefixd/indexer/tokenize"
	"github.com/prefixd/prefixd/store"
)

// Query asks which pods hold how much of a prompt. Exactly one of TokenIDs,
// BlockHashes or the text fields (Prompt, Messages) is given.
type Query struct {
	// Model is the served model name, or a LoRA adapter's name.
	Model string
	// LoRA names an adapter explicitly; empty when Model is one or none is used.
	LoRA string
	// CacheSalt is the request's cache_salt, hashed into the first block.
	CacheSalt string

	TokenIDs []uint32
	// BlockHashes are precomputed index keys, used as they are.
	BlockHashes []uint64
	// Prompt is completion text, Messages a chat; both are tokenized with
	// the sim's tokenizer.
	Prompt   string
	Messages []tokenize.Message

	// Pods restricts the answer to these pods; a name without "#rank" also
	// selects that pod's data-parallel ranks. Empty means all pods.
	Pods []string
}

// Result answers a Query.
type Result struct {
	Model string
	// BlockSize is the model's tokens per block; Tokens is the query's token
	// count (0 for block hash queries).
	BlockSize   int
	Tokens      int
	TotalBlocks int
	// Pods holds every pod with at least one matched block, best first.
	Pods []PodMatch
	// Explanation says why Pods is empty when the reason is not the
	// query's own (no pod has sent events for its model yet); "" otherwise.
	Explanation string
}

// PodMatch is one pod's share of a query.
type PodMatch struct {
	Pod    string
	Blocks int
	Tokens int
	// TierBlocks[t] counts matched blocks whose fastest tier on the pod is t.
	TierBlocks [store.NumTiers]int
	// Score is the tier-weighted share of the query's blocks, 0..1.
	Score float64
	// Stale is set while the pod's events are known to be incomplete (a gap
	// no replay filled).
	Stale bool
	// Incomplete is set when the store forgot blocks the pod still holds,
	// to make room: the pod may hold a longer prefix than Blocks.
	Incomplete bool
}

// Errors returned by Match.
var (
	ErrUnknownModel = errors.New("unknown model")
	ErrEmptyQuery   = errors.New("empty query")
	// ErrBadQuery: a query that mixes inputs, or asks by engine block
	// hashes a model keyed by token chains.
	ErrBadQuery = errors.New("bad query")
)

// Match answers q.
func (ix *Indexer) Match(ctx context.Context, q *Query) (*Result, error) {
	m, lora, err := ix.resolve(ctx, q)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return &Result{Model: q.Model, Explanation: "no pod has sent events yet: prefixd knows no model"}, nil
	}
	hs := m.hashers()
	res := &Result{Model: m.name, BlockSize: hs.blockSize}
	if m.pods.Load() == 0 {
		// Unless the store, shared with other prefixd processes, has pods
		// of it (below).
		res.Explanation = fmt.Sprintf("no pod serving model %q has sent events yet", m.name)
	}
	keys := q.BlockHashes
	switch {
	case len(q.BlockHashes) > 0:
		if len(q.TokenIDs) > 0 || q.Prompt != "" || len(q.Messages) > 0 {
			return nil, fmt.Errorf("%w: it gives both block hashes and a prompt: give one", ErrBadQuery)
		}
		if m.mode() == KeyModeTokens {
			return nil, fmt.Errorf("%w: model %q is keyed by token chains (key mode tokens): query by tokens or text, not engine block hashes", ErrBadQuery, m.name)
		}
	default:
		tokens := q.TokenIDs
		if q.Prompt != "" || len(q.Messages) > 0 {
			if len(tokens) > 0 {
				return nil, fmt.Errorf("%w: it gives both token ids and text: give one", ErrBadQuery)
			}
			tokens = tokenizeQuery(q)
		}
		if len(tokens) == 0 {
			return nil, fmt.Errorf("%w: no token ids, block hashes, prompt or messages", ErrEmptyQuery)
		}
		res.Tokens = len(tokens)
		h := hs.engine
		if m.mode() == KeyModeTokens {
			h = hs.own
		}
		keys = prompt(h, nil, tokens, blockhash.Prompt{Model: m.name, LoRA: lora, CacheSalt: q.CacheSalt})
	}
	res.TotalBlocks = len(keys)
	if len(keys) == 0 {
		return res, nil
	}
	matches, err := ix.store.Lookup(ctx, keys, ix.candidates(q.Pods), nil)
	if err != nil {
		return nil, err
	}
	res.Pods = make([]PodMatch, 0, len(matches))
	if len(matches) > 0 {
		res.Explanation = ""
	}
	for _, mt := range matches {
		pm := PodMatch{Pod: mt.Pod, Blocks: mt.Blocks, Tokens: mt.Blocks * hs.blockSize, TierBlocks: mt.TierBlocks, Incomplete: mt.Incomplete, Stale: mt.Stale}
		w := 0.0
		for t, n := range mt.TierBlocks {
			w += float64(n) * ix.opts.TierWeights[t]
		}
		pm.Score = w / float64(len(keys))
		res.Pods = append(res.Pods, pm)
	}
	sort.Slice(res.Pods, func(i, j int) bool {
		a, b := res.Pods[i], res.Pods[j]
		if a.Score != b.Score {
			return a.Score > b.Score
		}
		return a.Pod < b.Pod
	})
	return res, nil
}

// resolve finds the model a query names and the LoRA adapter it targets.
// m is nil when prefixd knows no model at all (no event has come, none is
// configured): any name may be right.
func (ix *Indexer) resolve(ctx context.Context, q *Query) (m *model, lora string, err error) {
	name := q.Model
	base, isLoRA := ix.lora(name)
	ix.mu.RLock()
	_, known := ix.models[name]
	none := len(ix.models) == 0
	ix.mu.RUnlock()
	if !known && !isLoRA {
		// Another process sharing the store may have learned the model
		// or the adapter from events this one has not seen.
		states, err := ix.store.Models(ctx)
		if err != nil {
			return nil, "", err
		}
		if _, ok := states[name]; ok {
			known, none = true, false
		} else if !none {
			if err := ix.loadLoRAs(ctx); err != nil {
				return nil, "", err
			}
			base, isLoRA = ix.lora(name)
		}
	}
	switch {
	case isLoRA:
		name, lora = base, q.Model
	case none:
		return nil, "", nil
	case !known:
		return nil, "", fmt.Errorf("%w %q: known models are %s", ErrUnknownModel, q.Model, strings.Join(ix.knownNames(), ", "))
	}
	if q.LoRA != "" {
		lora = q.LoRA
	}
	m, err = ix.model(ctx, name)
	return m, lora, err
}

// lora returns the base model of an adapter.
func (ix *Indexer) lora(name string) (base string, ok bool) {
	ix.loraMu.RLock()
	defer ix.loraMu.RUnlock()
	base, ok = ix.loras[name]
	return base, ok
}

// knownNames lists the models and adapters a query may name, sorted.
func (ix *Indexer) knownNames() []string {
	ix.mu.RLock()
	names := make([]string, 0, len(ix.models))
	for n := range ix.models {
		names = append(names, n)
	}
	ix.mu.RUnlock()
	ix.loraMu.RLock()
	for l, base := range ix.loras {
		names = append(names, l+" (adapter of "+base+")")
	}
	ix.loraMu.RUnlock()
	sort.Strings(names)
	return names
}

// candidates expands pod names to include their data-parallel ranks.
func (ix *Indexer) candidates(pods []string) []string {
	if len(pods) == 0 {
		return nil
	}
	out := append([]string(nil), pods...)
	ix.mu.RLock()
	for name := range ix.pods {
		if i := strings.LastIndexByte(name, '#'); i > 0 {
			for _, c := range pods {
				if c == name[:i] {
					out = append(out, name)
				}
			}
		}
	}
	ix.mu.RUnlock()
	return out
}

// tokenizeQuery tokenizes a query's text with the sim's tokenizer.
func tokenizeQuery(q *Query) []uint32 {
	if len(q.Messages) > 0 {
		var t tokenize.Tokenizer
		return t.AppendChat(nil, q.Messages)
	}
	return tokenize.AppendIDs(nil, q.Prompt)
}
