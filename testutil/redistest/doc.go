// Package redistest gives tests real Redis servers: a redis-server
// process (Debian's /usr/bin/redis-server) on a free loopback port, or a
// Redis Cluster of such processes, with no persistence and a directory in
// the test's TempDir, killed when the test ends.
//
// # Basics
//
//	url := redistest.Server(t)    // "redis://127.0.0.1:N"
//	url := redistest.Cluster(t)   // "redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C"
//
//	p := redistest.Start(t)       // a handle, for tests of Redis going away:
//	p.Kill()                      // SIGKILL: refused connections from now on
//	p.Restart()                   // empty again, on the same port
//	p.Pause(); p.Resume()         // SIGSTOP / SIGCONT: a server that hangs
//
// Do sends a command over a connection of its own and Info reads one INFO
// field, without a client library.
//
// # Caveats
//
// Tests that start a server are skipped when /usr/bin/redis-server or
// /usr/bin/redis-cli is missing, and fail instead under CI=true
// (scripts/test-deps.sh installs redis-server). The redis-server first on
// PATH, if any, is not used. Ports are picked at random below 55535 (a
// cluster node's bus port is 10000 above its port) and checked free, so
// another process can still take one between the check and the start:
// Start tries five ports. A cluster takes a second or two to form.
package redistest
