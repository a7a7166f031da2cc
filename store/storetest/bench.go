package storetest

import "fmt"

// The benchmark shape every backend's benchmarks share, so that their
// figures compare: BenchPods pods, distinct prompts of BenchPromptLen
// blocks, each prompt held whole by one pod, so that a lookup of a prompt
// walks all of it.
const (
	BenchPods      = 100
	BenchPromptLen = 512
)

// BenchPodNames are the benchmark's pods, "10.0.x.y:8000".
var BenchPodNames = func() []string {
	n := make([]string, BenchPods)
	for i := range n {
		n[i] = fmt.Sprintf("10.0.%d.%d:8000", i/256, i%256)
	}
	return n
}()

// PromptKeys writes the keys of benchmark prompt p into buf, whose
// capacity is at least BenchPromptLen, and returns them.
func PromptKeys(buf []uint64, p int) []uint64 {
	buf = buf[:BenchPromptLen]
	for j := range buf {
		buf[j] = Mix(uint64(p)<<20 | uint64(j))
	}
	return buf
}

// Mix is the splitmix64 finalizer: it spreads any uint64 over all 64
// bits, as engine hashes are.
func Mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
