"""A stand-in for llama-server: /health answers 503 while "loading", then 200; /v1 and /props
need the key."""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    """Serve until killed."""
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key-file", default="")
    p.add_argument("--load-s", type=float, default=0.0)
    # While loading, answer /health 200 {"status": "loading model"} instead of 503.
    p.add_argument("--loading-200", action="store_true")
    p.add_argument("--parallel", type=int, default=4)  # its slots, in /props as total_slots
    p.add_argument("--ctx-size", type=int, default=0)  # 0: the model's, here 8192
    args = p.parse_args()
    key = ""
    if args.api_key_file:
        with open(args.api_key_file) as f:  # exits non-zero when the credential is missing
            key = f.read().strip()
    ready_at = time.monotonic() + args.load_s

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                loading = time.monotonic() < ready_at
                code = 200 if args.loading_200 or not loading else 503
                self._answer(code, {"status": "loading model" if loading else "ok"})
            elif self.path in ("/v1/models", "/props"):
                ok = not key or self.headers.get("Authorization") == f"Bearer {key}"
                settings = {"n_ctx": args.ctx_size or 8192}
                body = {"data": [], "total_slots": args.parallel,
                        "default_generation_settings": settings}  # fmt: skip
                self._answer(200 if ok else 401, body if ok else {"error": "bad key"})
            else:
                self._answer(404, {"error": "not found"})

        def _answer(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake engine on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
