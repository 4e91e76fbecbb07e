"""When the certificates this control plane serves or uses expire: the cluster CA, the
cluster port's, the client port's (client.tls_cert), llmgwd's etcd client one and its
member's. A file is parsed again
only when it changes (a renewal shows at the next scrape); read in the scrape's thread."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llmgw import pki

log = logging.getLogger(__name__)

CERTS = ("ca", "cluster", "client", "etcd_client", "etcd_member")  # label values, in order


class Certificates(Collector):
    """llmgw_certificate_expiry_timestamp_seconds of each certificate file named (a file
    missing has no series; one that is not a certificate neither, and is logged once)."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self._files = dict(files)
        self._seen: dict[str, tuple[tuple[int, int], float | None]] = {}  # (mtime, size): expiry

    def expiry(self, cert: str) -> float | None:
        """When the named certificate expires (unix time), or None where it cannot be read."""
        path = self._files[cert]
        try:
            stat = path.stat()
        except OSError:
            self._seen[cert] = ((0, 0), None)  # not there (the client port without TLS)
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        seen = self._seen.get(cert)
        if seen is not None and seen[0] == stamp:
            return seen[1]
        try:
            expires: float | None = pki.validity(path.read_bytes())[1].timestamp()
        except (OSError, ValueError) as e:
            self._note(cert, stamp, f"{path}: {e}")
            return None
        self._seen[cert] = (stamp, expires)
        return expires

    def _note(self, cert: str, stamp: tuple[int, int], why: str) -> None:
        if self._seen.get(cert, ((-1, -1), None))[0] != stamp:
            log.warning("the %s certificate's expiry is not served: %s", cert, why)
        self._seen[cert] = (stamp, None)

    def snapshot(self) -> Certificates:
        """Itself: the files are read where the series are collected (one render at a time)."""
        return self

    def collect(self) -> Iterator[Metric]:
        """One series per certificate that could be read."""
        family = GaugeMetricFamily(
            "llmgw_certificate_expiry_timestamp_seconds",
            "When a certificate this control plane serves or uses stops being valid (unix time).",
            labels=["cert", "path"],
        )
        for cert in sorted(self._files, key=CERTS.index):
            expires = self.expiry(cert)
            if expires is not None:
                family.add_metric([cert, str(self._files[cert])], expires)
        yield family
