"""A steady stream of chat requests, run inside a host of the lan: WORKERS threads, each
sending one request at a time with the official openai client (its retries off) to the
base URLs given in turn, until stdin closes; then one JSON line per request on stdout.

    python chat_stream.py KEY MODEL WORKERS URL...
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import openai


def _one(client: openai.OpenAI, url: str, model: str) -> dict[str, Any]:
    started = time.time()
    try:
        r = client.chat.completions.create(
            model=model, max_tokens=4, temperature=0, seed=1,
            messages=[{"role": "user", "content": "Say hi."}],
        )  # fmt: skip
        ok, error, cause = bool(r.choices), "", ""
    except Exception as e:
        # the cause: httpx's ConnectError where the request never reached a server
        ok, error, cause = False, repr(e)[:300], type(e.__cause__).__name__
    return {"url": url, "t0": started, "t1": time.time(), "ok": ok, "error": error, "cause": cause}


def _worker(n: int, key: str, model: str, urls: list[str], stop: threading.Event,
            out: list[dict[str, Any]]) -> None:  # fmt: skip
    clients = {u: openai.OpenAI(base_url=u, api_key=key, max_retries=0, timeout=30) for u in urls}
    i = n
    while not stop.is_set():
        url = urls[i % len(urls)]
        out.append(_one(clients[url], url, model))
        i += 1


def main() -> None:
    key, model, workers, urls = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    stop = threading.Event()
    out: list[dict[str, Any]] = []
    threads = [threading.Thread(target=_worker, args=(n, key, model, urls, stop, out))
               for n in range(workers)]  # fmt: skip
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    for row in out:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
