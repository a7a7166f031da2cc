package ratelog

import (
	"sync"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := New(time.Hour)
	if ok, n := l.Allow(); !ok || n != 0 {
		t.Fatalf("first line: ok %v suppressed %d; want allowed", ok, n)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if ok, _ := l.Allow(); ok {
					t.Error("a line within the interval was allowed")
				}
			}
		})
	}
	wg.Wait()
	l.next.Store(0) // the interval has passed
	if ok, n := l.Allow(); !ok || n != 800 {
		t.Fatalf("after the interval: ok %v suppressed %d; want allowed with 800 suppressed", ok, n)
	}
	var zero Limiter
	for range 3 {
		if ok, _ := zero.Allow(); !ok {
			t.Fatal("the zero Limiter suppressed a line")
		}
	}
}
