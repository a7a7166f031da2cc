//go:build race

package rpc

// raceEnabled is set under the race detector, where sync.Pool drops a
// share of what it is given and allocation counts mean nothing.
const raceEnabled = true
