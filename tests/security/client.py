#!/usr/bin/env python3
"""Hostile clients of a ddpd for the security suite (run as whichever user the test picks).

  client.py nested SOCKET N        job.submit of a spec of N nested '[' (no reply awaited)
  client.py idle-unix SOCKET N     N idle connections to the control socket, held until killed
  client.py idle-tcp HOST PORT N   N idle TCP connections, held until killed; prints how many
                                   the daemon closed (one line per second: "closed K")
  client.py call SOCKET METHOD JSON  one request; prints the reply line
"""
import json
import socket
import sys
import time


def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def main():
    cmd = sys.argv[1]
    if cmd == "nested":
        s = unix(sys.argv[2])
        spec = "[" * int(sys.argv[3])
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "job.submit",
                           "params": {"spec": spec}}) + "\n"
        s.sendall(line.encode())
        time.sleep(3600)
    elif cmd == "idle-unix":
        conns = []
        for _ in range(int(sys.argv[3])):
            try:
                conns.append(unix(sys.argv[2]))
            except OSError:
                break
        print("open", len(conns), flush=True)
        time.sleep(3600)
    elif cmd == "idle-tcp":
        conns = []
        for _ in range(int(sys.argv[4])):
            try:
                conns.append(socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=2))
            except OSError:
                break
        print("open", len(conns), flush=True)
        for c in conns:
            c.setblocking(False)
        while True:
            closed = 0
            for c in conns:
                try:
                    closed += c.recv(1, socket.MSG_PEEK) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
            print("closed", closed, flush=True)
            time.sleep(1)
    elif cmd == "call":
        s = unix(sys.argv[2])
        s.sendall((json.dumps({"jsonrpc": "2.0", "id": 1, "method": sys.argv[3],
                               "params": json.loads(sys.argv[4])}) + "\n").encode())
        f = s.makefile()
        print(f.readline().strip())


if __name__ == "__main__":
    main()
