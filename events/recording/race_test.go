//go:build race

package recording

const raceEnabled = true
