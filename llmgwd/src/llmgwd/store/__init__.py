"""The cluster's store: an etcd-shaped interface and its backends."""

from llmgwd.store.base import (
    KV,
    Compare,
    Delete,
    Event,
    Get,
    Put,
    Store,
    StoreUnavailable,
    TxnResult,
    prefix_end,
)

__all__ = [
    "KV",
    "Compare",
    "Delete",
    "Event",
    "Get",
    "Put",
    "Store",
    "StoreUnavailable",
    "TxnResult",
    "prefix_end",
]
