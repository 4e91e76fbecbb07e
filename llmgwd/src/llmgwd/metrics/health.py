"""The series of what can go wrong slowly, each read in the background or from a cache: the
budgets' use, the store's quorum, the certificates' expiry (for the alerts of
packaging/prometheus/)."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.config import ServerConfig
from llmgwd.accounting.levels import Levels
from llmgwd.catalog import Catalog, KeyLimits
from llmgwd.metrics.budgets import BudgetSeries
from llmgwd.metrics.certificates import Certificates
from llmgwd.metrics.store_health import StoreHealth
from llmgwd.planes import etcd_member
from llmgwd.planes.listing import EtcdCluster


def certificate_files(cfg: ServerConfig) -> dict[str, Path]:
    """The certificates llmgwd serves or uses, by their label (the etcd ones on etcd only); a
    file that is not there has no series."""
    pki = Path(cfg.state_dir) / "pki"
    files = {"ca": pki / etcd_member.CA_CERT, "cluster": pki / "server.pem"}
    # The site's, or the one llmgwd makes from the cluster CA where it names none.
    files["client"] = Path(cfg.client.tls_cert) if cfg.client.tls_cert else pki / "client.pem"
    if cfg.store.backend == "etcd":
        files["etcd_client"] = Path(cfg.store.cert_file or pki / etcd_member.CLIENT_CERT)
        files["etcd_member"] = pki / etcd_member.MEMBER_CERT
    return files


@dataclass(frozen=True, slots=True)
class HealthSeries:
    """The three collectors, and what keeps the first two current."""

    budgets: BudgetSeries
    store: StoreHealth
    certificates: Certificates

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """The background refreshes to run while llmgwd does."""
        return [self.budgets.run(), self.store.run()]

    def collectors(self) -> list[BudgetSeries | StoreHealth | Certificates]:
        """What the scraper snapshots at each scrape."""
        return [self.budgets, self.store, self.certificates]


def build(
    cfg: ServerConfig, catalog: Catalog, levels: Levels, etcd: EtcdCluster | None
) -> HealthSeries:
    """The collectors of this llmgwd: keys' budgets from the catalog, the levels' from levels,
    their use from the catalog's store."""

    def keys() -> list[tuple[str, KeyLimits]]:
        return [(k.id, k.limits) for k in catalog.keys() if not k.revoked]  # noqa: SIM118 (a list)

    def key_ids() -> list[str]:
        return [k.id for k in catalog.keys()]  # noqa: SIM118 (a list)

    return HealthSeries(
        BudgetSeries(keys, key_ids, levels, catalog.store),
        StoreHealth(etcd),
        Certificates(certificate_files(cfg)),
    )
