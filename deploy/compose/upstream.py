"""The example API of compose.yaml: no idempotency of its own, a new order per POST.

The README's example upstream, on 0.0.0.0:3000 so the proxy's container reaches it.
POST /slow takes five seconds (to watch a duplicate get 409); GET /healthz answers
the container's health check.
"""

import itertools
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ORDERS = itertools.count(1)


class Api(BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer(200 if self.path == "/healthz" else 404, {"path": self.path})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/slow":
            time.sleep(5)
        self._answer(201, {"order": next(ORDERS), "upstream_key": self.headers.get("Idempotency-Key")})

    def _answer(self, status, document):
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer(("0.0.0.0", 3000), Api).serve_forever()
