#!/usr/bin/python3
"""A KV event publisher on real libzmq (pyzmq), driven line by line.

Tests start it as a subprocess (testutil/zmqpub) and write one command per
line on stdin; every command answers exactly one line on stdout, "ok ..." or
"err ...". The publisher is an XPUB, so that "wait-sub" can block until a
subscriber's subscription has arrived (the slow-joiner problem): messages
sent after that reach the subscriber.

Commands:
  bind ENDPOINT               bind the publisher; answers "ok <bound endpoint>"
  connect ENDPOINT            connect the publisher to a bound SUB
  wait-sub [SECONDS]          wait for the next subscription; "ok <hex>"
  send B64 [B64...]           publish one message of these frames ("-" is an
                              empty frame)
  sendfile PATH               publish the live messages of a JSONL recording
                              (frames_b64; replay files' leading empty frame
                              is dropped and their end marker skipped); "ok N"
  skip SEQ [SEQ...]           withhold these seqs from the live stream (they
                              are still kept for replay)
  replay-bind ENDPOINT [shape=topic|notopic|shortseq|nodelim|noend]
                              serve a ROUTER replay endpoint over everything
                              published so far; "ok <bound endpoint>"
  raw ENDPOINT B64            open a plain TCP connection, write the bytes,
                              keep it open until "close"
  bench N SIZE                publish N messages with SIZE-byte payloads as
                              fast as possible; "ok <seconds>"
  close                       close every socket and connection
  quit                        exit
"""

import base64
import json
import socket
import struct
import sys
import threading
import time

import zmq

END = b"\xff" * 8
TOPIC = b"kv@127.0.0.1:8001@sim-model"


class Publisher:
    def __init__(self):
        self.ctx = zmq.Context()
        self.pub = None
        self.skip = set()
        self.history = []  # (topic, seq bytes, payload) of every message, skipped or not
        self.lock = threading.Lock()  # guards history
        self.replays = []  # (thread, stop event)
        self.raws = []

    def socket(self):
        if self.pub is None:
            self.pub = self.ctx.socket(zmq.XPUB)
            self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, also repeated ones
            self.pub.setsockopt(zmq.SNDHWM, 0)  # never drop for a slow subscriber
            self.pub.setsockopt(zmq.LINGER, 1000)
        return self.pub

    def publish(self, frames):
        if len(frames) == 3 and len(frames[1]) == 8:
            with self.lock:
                self.history.append(tuple(frames))
            if struct.unpack(">Q", frames[1])[0] in self.skip:
                return False
        self.socket().send_multipart(frames)
        return True

    def cmd_bind(self, endpoint):
        s = self.socket()
        s.bind(endpoint)
        return s.getsockopt(zmq.LAST_ENDPOINT).decode()

    def cmd_connect(self, endpoint):
        self.socket().connect(endpoint)
        return ""

    def cmd_wait_sub(self, seconds="10"):
        s = self.socket()
        deadline = time.monotonic() + float(seconds)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not s.poll(int(left * 1000), zmq.POLLIN):
                raise TimeoutError("no subscription within %s s" % seconds)
            sub = s.recv()
            if sub[:1] == b"\x01":  # skip unsubscriptions
                return sub.hex()

    def cmd_send(self, *b64):
        self.publish([b"" if f == "-" else base64.b64decode(f) for f in b64])
        return ""

    def cmd_sendfile(self, path):
        n = 0
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                frames = [base64.b64decode(x) for x in json.loads(line)["frames_b64"]]
                if len(frames) == 4 and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) == 3 and frames[1] == END:
                    continue
                if self.publish(frames):
                    n += 1
        return str(n)

    def cmd_skip(self, *seqs):
        self.skip.update(int(x) for x in seqs)
        return ""

    def cmd_replay_bind(self, endpoint, shape="shape=topic"):
        shape = shape.split("=", 1)[-1]
        if shape not in ("topic", "notopic", "shortseq", "nodelim", "noend"):
            raise ValueError("unknown shape %r" % shape)
        router = self.ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        bound = router.getsockopt(zmq.LAST_ENDPOINT).decode()
        stop = threading.Event()
        t = threading.Thread(target=self.serve_replay, args=(router, shape, stop), daemon=True)
        t.start()
        self.replays.append((t, stop))
        return bound

    def serve_replay(self, router, shape, stop):
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(50):
                continue
            msg = router.recv_multipart()
            ident, req = msg[0], msg[1:]
            if req and req[0] == b"":  # a DEALER's delimiter; a REQ's is stripped
                req = req[1:]
            if len(req) != 1 or len(req[0]) != 8:
                continue
            start = struct.unpack(">Q", req[0])[0]
            with self.lock:
                batches = [h for h in self.history if struct.unpack(">Q", h[1])[0] >= start]
            for topic, seq, payload in batches:
                router.send_multipart(self.reply(ident, shape, topic, seq, payload))
            if shape != "noend":
                router.send_multipart(self.reply(ident, shape, b"", END, b""))
        router.close(linger=0)

    @staticmethod
    def reply(ident, shape, topic, seq, payload):
        if shape == "topic":
            return [ident, b"", topic, seq, payload]
        if shape == "shortseq":
            return [ident, b"", topic, seq[4:], payload]
        if shape == "nodelim":
            return [ident, topic, seq, payload]
        return [ident, b"", seq, payload]  # notopic, noend

    def cmd_raw(self, endpoint, b64):
        host, port = endpoint.split("://", 1)[1].rsplit(":", 1)
        c = socket.create_connection((host, int(port)), timeout=5)
        c.sendall(base64.b64decode(b64))
        self.raws.append(c)
        return ""

    def cmd_bench(self, n, size):
        payload = bytes(range(256)) * (int(size) // 256 + 1)
        payload = payload[: int(size)]
        send, more = self.socket().send, zmq.SNDMORE
        pack = struct.Struct(">Q").pack
        t0 = time.perf_counter()
        for i in range(1, int(n) + 1):  # three sends: about 2.5x send_multipart's rate
            send(TOPIC, more)
            send(pack(i), more)
            send(payload)
        return "%.6f" % (time.perf_counter() - t0)

    def cmd_close(self):
        for t, stop in self.replays:
            stop.set()
            t.join()
        self.replays = []
        for c in self.raws:
            c.close()
        self.raws = []
        if self.pub is not None:
            self.pub.close()
            self.pub = None
        return ""


def main():
    p = Publisher()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        name = words[0]
        if name == "quit":
            p.cmd_close()
            print("ok", flush=True)
            break
        fn = getattr(p, "cmd_" + name.replace("-", "_"), None)
        try:
            if fn is None:
                raise ValueError("unknown command %r" % name)
            out = fn(*words[1:])
            print(("ok " + out).rstrip(), flush=True)
        except Exception as e:  # any failure is the answer to this command
            print("err %s: %s" % (type(e).__name__, str(e).replace("\n", " ")), flush=True)
    p.ctx.term()


if __name__ == "__main__":
    main()
