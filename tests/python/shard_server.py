"""A small threaded HTTP server for the streaming tests: serves the files of one folder on
127.0.0.1 (port 0), honours ``Range: bytes=N-``, and misbehaves on request by path prefix:

    /404/<name>            404
    /fail/<k>/<name>       500 for the first k requests of that path, then the file
    /drop/<n>/<name>       every response closes the connection after byte n of the shard
    /droponce/<n>/<name>   the first response closes after byte n, later ones serve the rest
    /stall/<n>/<name>      sends n bytes of the shard, then sends nothing more until shutdown
                           (or until ``release_stalls()``)
    /slow/<ms>/<name>      answers after ms milliseconds (a remote store's latency)

``hits[path]`` counts the requests of each path."""

from __future__ import annotations

import collections
import http.server
import os
import re
import threading


class _Listener(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # many workers connect at once (socketserver's 5 drops their SYNs)


class ShardServer:
    def __init__(self, root: str) -> None:
        self.root = root
        self.hits: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 (http.server's name)
                server._serve(self)

        self._httpd = _Listener(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def release_stalls(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "ShardServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        path = h.path
        with self._lock:
            self.hits[path] += 1
            hit = self.hits[path]
        mode, arg, name = "plain", 0, path.lstrip("/")
        m = re.match(r"^/(404|fail|drop|droponce|stall|slow)/(?:(\d+)/)?(.+)$", path)
        if m:
            mode, arg, name = m.group(1), int(m.group(2) or 0), m.group(3)
        if mode == "404":
            return self._error(h, 404)
        if mode == "fail" and hit <= arg:
            return self._error(h, 500)
        if mode == "slow":
            self._stop.wait(arg / 1000)
        file = os.path.join(self.root, name)
        if not os.path.isfile(file):
            return self._error(h, 404)
        data = open(file, "rb").read()
        start = 0
        rng = h.headers.get("Range")
        if rng:
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
        h.send_response(206 if start else 200)
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        cut = len(data)
        if mode == "drop" or (mode == "droponce" and hit == 1) or mode == "stall":
            cut = max(start, min(arg, len(data)))
        try:
            h.wfile.write(data[start:cut])
            h.wfile.flush()
            if mode == "stall":
                self._stop.wait()
            elif cut < len(data):  # drop: end the connection mid-shard
                h.close_connection = True
                h.connection.shutdown(2)
        except OSError:
            pass

    @staticmethod
    def _error(h: http.server.BaseHTTPRequestHandler, status: int) -> None:
        body = f"status {status}\n".encode()
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
