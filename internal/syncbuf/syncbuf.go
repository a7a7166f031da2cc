// Package syncbuf is a bytes.Buffer safe for one writer and concurrent
// readers: the output of a process, written by its copier goroutine and
// read by whoever waits on it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose Write and String may be called
// concurrently. The zero value is empty and ready to use.
type Buffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
