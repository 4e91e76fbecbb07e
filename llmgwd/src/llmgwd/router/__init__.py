"""The /v1 router: OpenAI's API in front of the pool's engine replicas.

Entry point, for the daemon::

    router = Router(keys, models, pool, max_body_bytes=config.client.max_body_bytes, meter=meter)
    client_app.add_subapp("/v1", router.app)  # all of /v1, 404 and 405 too, in OpenAI's shape
    ...
    await router.close()  # also run by client_app's on_cleanup

`keys` and `models` are the daemon's in-memory caches (the Keys and Models protocols);
Keys.authenticate may return a revoked key (revoked=True) so the 401 can say "revoked".
`pool` is the llmgwd.pool.Pool. The router reads request bodies itself with max_body_bytes,
so the client app's client_max_size does not limit /v1 (an HTTPRequestEntityTooLarge from
it still answers 413 in OpenAI's shape). A client that leaves mid-request has its engine
request closed whether or not the daemon's AppRunner sets handler_cancellation.
`router.balancer` counts the requests in flight per replica.

`meter` (llmgwd.router.metering.Meter over the daemon's llmgwd.usage.Usage) applies each key's
rate limits and budgets before a request reaches an engine and counts what the answer used;
without one the router makes its own, whose usage stays in memory.
"""

from llmgwd.router.balancer import Balancer
from llmgwd.router.errors import ApiError
from llmgwd.router.v1 import Keys, Models, Router

__all__ = ["ApiError", "Balancer", "Keys", "Models", "Router"]
