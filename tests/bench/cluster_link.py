"""One TCP stream's rate between two hosts of tests/bench/cluster.sh (iperf is not installed).

    cluster_link.py serve ADDR PORT          accepts one connection and reads until it closes
    cluster_link.py send ADDR PORT SECONDS   connects (retrying for 10 s while the server starts),
                                             sends for SECONDS, prints the rate in Gbit/s
The sender's rate counts what the server acknowledged reading: it waits for the server's byte
count after shutting its side down.
"""
import socket
import sys
import time


def serve(addr, port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(1)
    c, _ = ls.accept()
    n = 0
    buf = bytearray(1 << 20)
    while True:
        k = c.recv_into(buf)
        if k == 0:
            break
        n += k
    c.sendall(str(n).encode())
    c.close()


def send(addr, port, seconds):
    deadline = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection((addr, port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    chunk = b"\0" * (1 << 20)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    n = int(s.recv(64).decode())
    dt = time.monotonic() - t0
    print(f"{n * 8 / dt / 1e9:.2f}")


if __name__ == "__main__":
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    serve(addr, port) if mode == "serve" else send(addr, port, float(sys.argv[4]))
