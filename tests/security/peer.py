#!/usr/bin/env python3
"""A peer daemon's side of the links, for the security suite (never a real daemon).

  peer.py v1-start HOST PORT SECRET_FILE NODE_NAME UID JOB RUN_TOKEN
      dials a daemon as an older (version 1) peer called NODE_NAME, and once authenticated asks
      it to start rank 1 of job JOB as UID; prints each step ("refused: ...", "up", "sent start")
  peer.py relay LISTEN_PORT HOST PORT MODE
      a TCP relay between a daemon that dials LISTEN_PORT and the daemon at HOST:PORT. It passes
      the handshake through untouched; then, on the dialer's side, MODE "inject" adds a start
      request for uid 0 (as a version-1 line and as a frame of version 2), and MODE "replay"
      sends every message again once it has passed, and MODE "strip" removes the version and
      the capabilities from the dialer's hello (a downgrade attempt). Prints what it did.
Version 1's HMAC is libsodium's crypto_auth (HMAC-SHA-512 cut to 32 bytes) under the BLAKE2b
hash of the secret keyed "ddpd-v1" (daemon/auth.c).
"""
import hashlib
import hmac
import json
import os
import select
import socket
import struct
import sys


def key_of(path):
    secret = open(path, "rb").read().rstrip(b"\n\r ")
    return hashlib.blake2b(secret, digest_size=32, key=b"ddpd-v1").digest()


def mac(key, role, a, b):
    msg = role.encode().ljust(16, b"\0")[:16] + a + b
    return hmac.new(key, msg, hashlib.sha512).digest()[:32]


def start_msg(job, uid, token, node="x"):
    spec = json.dumps({"name": "injected", "data": {"train": "/nonexistent/*.bin"}})
    return {"t": "start", "job": job, "name": "injected", "ranks": [1], "world": 2,
            "rdzv": "127.0.0.1:1", "token": token, "spec": spec, "cwd": "/", "uid": uid,
            "gid": uid, "threads": 1, "elastic": False, "max_restarts": 0}


def v1_start(host, port, secret, node, uid, job, token):
    key = key_of(secret)
    s = socket.create_connection((host, int(port)), timeout=10)
    f = s.makefile("rwb")
    nd = os.urandom(32)
    f.write((json.dumps({"hello": node, "nonce": nd.hex()}) + "\n").encode())
    f.flush()
    line = f.readline()
    if not line:
        print("refused: closed", flush=True)
        return
    ch = json.loads(line)
    if "error" in ch:
        print("refused:", ch["error"], flush=True)
        return
    nl = bytes.fromhex(ch["nonce"])
    f.write((json.dumps({"mac": mac(key, "ddpd-client", nl, nd).hex()}) + "\n").encode())
    f.flush()
    ok = f.readline()
    if not ok or "ok" not in json.loads(ok):
        print("refused: no ok", flush=True)
        return
    print("up", flush=True)
    f.write((json.dumps(start_msg(int(job), int(uid), token)) + "\n").encode())
    f.flush()
    print("sent start", flush=True)
    reply = f.readline()
    print("reply:", reply.decode().strip(), flush=True)


class Side:
    """One direction's bytes as messages: lines until `switch` says the next ones are frames."""

    def __init__(self, switch):
        self.buf = b""
        self.lines = 0
        self.framed = False
        self.switch = switch  # switch(side, line) -> True when frames follow this line

    def messages(self, data):
        self.buf += data
        out = []
        while True:
            if not self.framed:
                i = self.buf.find(b"\n")
                if i < 0:
                    break
                line, self.buf = self.buf[:i + 1], self.buf[i + 1:]
                self.lines += 1
                out.append(line)
                self.framed = self.switch(self, line)
            else:
                if len(self.buf) < 4:
                    break
                n = struct.unpack(">I", self.buf[:4])[0]
                if len(self.buf) < 4 + n:
                    break
                out.append(self.buf[:4 + n])
                self.buf = self.buf[4 + n:]
        return out


def relay(listen_port, host, port, mode):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", int(listen_port)))
    srv.listen(8)
    print("listening", flush=True)
    done = False
    while True:
        a, _ = srv.accept()
        try:
            b = socket.create_connection((host, int(port)))
        except OSError:
            a.close()
            continue
        st = {"v2": False}

        def down_switch(side, line):  # the listener's challenge says the version
            if side.lines == 1:
                st["v2"] = b'"v":2' in line
            return st["v2"] and side.lines == 1

        up = Side(lambda side, line: st["v2"] and side.lines == 2)  # frames after the proof
        down = Side(down_switch)
        after = []  # the dialer's messages after its proof (v2: the header first)
        while True:
            r, _, _ = select.select([a, b], [], [], 30)
            if not r:
                break
            if a in r:
                data = a.recv(65536)
                if not data:
                    break
                if mode == "strip" and up.lines == 0 and data.endswith(b"\n"):
                    hello = json.loads(data)
                    hello.pop("v", None)
                    hello.pop("caps", None)
                    data = (json.dumps(hello) + "\n").encode()
                    print("stripped", flush=True)
                b.sendall(data)
                for m in up.messages(data):
                    if up.framed or up.lines > 2:
                        after.append(m)
                v2 = st["v2"]
                authed = up.lines >= 2 and (not v2 or len(after) >= 1)
                if not done and mode == "inject" and authed:
                    line = (json.dumps(start_msg(999, 0, "f" * 64)) + "\n").encode()
                    b.sendall(line if not v2 else struct.pack(">I", 60) + os.urandom(60))
                    print("injected", "frame" if v2 else "line", flush=True)
                    done = True
                msgs = after[1:] if v2 else after
                # replayed once a start request went through (the only message of hundreds of
                # bytes: a ping or a status is far shorter), so that the replay carries it
                if not done and mode == "replay" and any(len(m) > 300 for m in msgs):
                    for m in msgs:
                        b.sendall(m)
                    print("replayed", len(msgs), flush=True)
                    done = True
            if b in r:
                data = b.recv(65536)
                if not data:
                    break
                a.sendall(data)
                down.messages(data)
        a.close()
        b.close()


if __name__ == "__main__":
    if sys.argv[1] == "v1-start":
        v1_start(*sys.argv[2:9])
    elif sys.argv[1] == "relay":
        relay(*sys.argv[2:6])
