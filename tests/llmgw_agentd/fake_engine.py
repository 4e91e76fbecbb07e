"""A stand-in for llama-server: /health answers 503 while "loading", then 200; /v1 and /props
need the key; a chat takes --answer-s, and /metrics counts those in flight as llama-server's
requests_processing; --ignore-term: SIGTERM does nothing (an engine that hangs on it)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
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
    p.add_argument("--answer-s", type=float, default=0.0)
    p.add_argument("--ignore-term", action="store_true")
    args = p.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = [0]  # chats being answered
    lock = threading.Lock()
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
            elif self.path == "/metrics" and self._keyed():
                gauge = "llamacpp:requests_processing"
                text = f"# TYPE {gauge} gauge\n{gauge} {held[0]}\n"
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._answer(404, {"error": "not found"})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                held[0] += 1
            try:
                time.sleep(args.answer_s)
            finally:
                with lock:
                    held[0] -= 1
            self._answer(200, {"choices": [{"message": {"content": "hi"}}]})

        def _keyed(self) -> bool:
            return not key or self.headers.get("Authorization") == f"Bearer {key}"

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
