package indexer

import (
	"strconv"

	"github.com/prefixd/prefixd/events"
)

// Pods are named by the endpoint their topic gives: kv@IP:PORT@MODEL names
// pod IP:PORT, the name a picker scores and --zmq-replay uses.
// llm-d-inference-sim's data-parallel rank r publishes a topic of its own
// (its port is the rank's), so its ranks are told apart by topic alone;
// vLLM's ranks publish one topic and are told apart by the batch's rank:
// a rank above 0 of a topic several ranks share is named IP:PORT#r.
// Topics that name no pod are named by their source, with #r for ranks
// above 0.
//
// The indexer learns which ranks share a topic from the batches it sees.
// When a topic seen from one rank r > 0 alone is then seen from another,
// the pod that rank r made under the plain name is forgotten (its next
// batch makes IP:PORT#r, a pod without history): a rank above 0 comes
// first only when rank 0 was missed.

// rankBit is the bit of rank in a topic's rank mask; ranks from 63 up share
// the last bit.
func rankBit(rank int) uint64 { return 1 << min(max(rank, 0), 63) }

// appendName appends the name of the pod of a batch with this topic and
// rank from src to dst, for a topic whose ranks seen so far are mask; model
// is a view of the topic, or src.Model's bytes.
func appendName(dst, topic []byte, rank int, src Source, mask uint64) (name, model []byte) {
	pod, model, ok := events.ParseTopic(topic)
	shared := !ok || mask&^rankBit(rank) != 0
	if ok {
		dst = append(dst, pod...)
	} else {
		dst = append(dst, src.Pod...)
		model = []byte(src.Model)
	}
	if rank > 0 && shared {
		dst = append(dst, '#')
		dst = strconv.AppendInt(dst, int64(rank), 10)
	}
	return dst, model
}

// PodName returns the name of the pod of a batch, and its model, as the
// indexer names it now (see the package documentation on names).
func (ix *Indexer) PodName(topic []byte, rank int, src Source) (podName, modelName string) {
	var buf [128]byte
	name, model := appendName(buf[:0], topic, rank, src, ix.ranks(topic))
	return string(name), string(model)
}

// ranks returns the ranks seen on a kv@ topic.
func (ix *Indexer) ranks(topic []byte) uint64 {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.topics[string(topic)] // no allocation: map index by converted bytes
}

// seeRank records that topic carries batches of rank, and returns the
// name of a pod that this makes wrong: the plain name, when the one rank
// above 0 seen so far held it. At most MaxPods topics are remembered;
// others keep plain names.
func (ix *Indexer) seeRank(topic []byte, rank int) (displaced string) {
	pod, _, ok := events.ParseTopic(topic)
	if !ok {
		return ""
	}
	bit := rankBit(rank)
	ix.mu.RLock()
	mask, known := ix.topics[string(topic)]
	ix.mu.RUnlock()
	if mask&bit != 0 {
		return ""
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	mask, known = ix.topics[string(topic)]
	if mask&bit != 0 || !known && len(ix.topics) >= ix.opts.MaxPods {
		return ""
	}
	ix.topics[string(topic)] = mask | bit
	if mask != 0 && mask&rankBit(0) == 0 && mask&(mask-1) == 0 {
		// One rank above 0 had the topic to itself, under the plain name.
		return string(pod)
	}
	return ""
}

// seeRanks records the ranks of batches known ahead (recordings), so that
// they are named as if every rank had been seen from the start.
func (ix *Indexer) seeRanks(topic []byte, mask uint64) {
	if _, _, ok := events.ParseTopic(topic); !ok {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, known := ix.topics[string(topic)]; known || len(ix.topics) < ix.opts.MaxPods {
		ix.topics[string(topic)] |= mask
	}
}
