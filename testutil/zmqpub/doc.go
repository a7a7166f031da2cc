// Package zmqpub gives tests real libzmq KV event publishers: each
// Publisher is a scripts/zmqpub.py process (pyzmq on Debian's libzmq, run
// by /usr/bin/python3) that binds or connects an XPUB, publishes messages
// or whole recordings, withholds chosen seqs, and serves a ROUTER replay
// endpoint in either reply shape. It also makes hand-written ZMTP bytes for
// peers that misbehave on purpose (oversized frame headers, broken READY
// commands, garbage), and dials from other loopback source addresses
// (DialFrom), as peers on other hosts would.
//
// # Basics
//
//	p := zmqpub.Start(t)                  // killed when the test ends
//	ep := p.Bind("tcp://127.0.0.1:0")     // or p.Connect(boundSUB)
//	... subscriber connects to ep ...
//	p.WaitSubscribed()                     // its subscription has arrived
//	p.Send(topic, seq, payload)            // or p.SendFile(recording)
//
// A restart is a Kill and a new Start that binds the same port.
//
// # Caveats
//
// Tests that call Start are skipped when /usr/bin/python3 cannot import
// zmq, and fail under CI=true (scripts/test-deps.sh installs python3-zmq).
// The python3 first on PATH may lack zmq and is not used. Publisher
// methods other than Do fail the test and must run on its goroutine. The
// XPUB never drops for a slow subscriber (SNDHWM 0), unlike a default PUB.
package zmqpub
