package indexer

import (
	"sync"

	"github.com/prefixd/prefixd/events"
)

// Unknown event types and fields are skipped and counted by name; the
// names are the publisher's, so only valid labels, and only so many, become
// label values.

// maxSkippedNames bounds the distinct names of unknown event types and of
// unknown fields that become label values; later names count as "other".
const maxSkippedNames = 64

// skippedNames are the names of unknown event types or fields already
// used as label values.
type skippedNames struct {
	mu    sync.Mutex
	names map[string]struct{}
}

// label returns the label value for name: the name when it is a valid
// label and a slot is free or it has one, else "other" or "invalid".
func (s *skippedNames) label(name []byte) string {
	switch string(name) {
	case events.NoTypeName:
		return "no_type"
	case events.NonStringKeyName:
		return "non_string_key"
	}
	if events.CheckLabel(name) != nil {
		return "invalid"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.names[string(name)]; ok {
		return string(name)
	}
	if len(s.names) >= maxSkippedNames {
		return "other"
	}
	if s.names == nil {
		s.names = make(map[string]struct{})
	}
	l := string(name)
	s.names[l] = struct{}{}
	return l
}

// countSkippedNames counts a batch's unknown event types and fields by name.
func (ix *Indexer) countSkippedNames(b *events.Batch) {
	for _, nc := range b.SkippedTypes {
		ix.metrics.skippedTypes.WithLabelValues(ix.typeNames.label(nc.Name)).Add(float64(nc.Count))
	}
	for _, nc := range b.UnknownFieldNames {
		ix.metrics.skippedFields.WithLabelValues(ix.fieldNames.label(nc.Name)).Add(float64(nc.Count))
	}
}
