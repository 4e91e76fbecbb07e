"""The /v1 router: OpenAI's API in front of the pool's engine replicas.

Entry point, for the daemon::

    router = Router(keys, models, pool, max_body_bytes=config.client.max_body_bytes, meter=meter)
    client_app.add_subapp("/v1", router.app)  # all of /v1, 404 and 405 too, in OpenAI's shape
    ...
    await router.close()  # also run by client_app's on_cleanup

`keys` and `models` are the daemon's in-memory caches (the Keys and Models protocols);
Keys.authenticate may return a revoked key (revoked=True) so the 401 can say "revoked".
`pool` is the llmgwd.nodes.pool.Pool. The router reads request bodies itself with max_body_bytes,
so the client app's client_max_size does not limit /v1 (an HTTPRequestEntityTooLarge from
it still answers 413 in OpenAI's shape). A client that leaves mid-request has its engine
request closed whether or not the daemon's AppRunner sets handler_cancellation.
Routes: /models, /chat/completions, /completions and /embeddings. Only the fields each route
allows (llmgwd.router.fields) reach an engine; any other is a 400 naming it.

`router.balancer` (pass `balancer=Balancer(pool, queue_size=..., queue_timeout_s=...)` to set
it up) counts the requests in flight per replica and never sends one more than its slots (as
its engine reported them; 4 when unknown). While all are full, requests wait in a bounded
first-come line per model, then get a 503 `model_busy` with Retry-After. A refused connect or
a 503 before any byte goes to another replica; a replica failing 3 times in a row is left out
for 10 s, doubling while it keeps failing (`balancer.ejections`). With prefix_aware (the
default; `client.prefix_balancing`), a request goes to the replica holding its prompt's prefix
or pinned by its x-session-id, unless much busier (`router/prefix.py`). Every answer carries
x-llmgw-overhead-ms, the gateway's own time (`router/overhead.py`).

`meter` (llmgwd.router.metering.Meter over the daemon's llmgwd.accounting.usage.Usage) applies
each key's rate limits and budgets before a request reaches an engine and counts what the
answer used; without one the router makes its own, whose usage stays in memory.
"""

from llmgwd.router.balancer import Balancer
from llmgwd.router.errors import ApiError
from llmgwd.router.v1 import Keys, Models, Router

__all__ = ["ApiError", "Balancer", "Keys", "Models", "Router"]
