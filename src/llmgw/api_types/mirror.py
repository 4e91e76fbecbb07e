"""/api/v1's mirror: a file of an import, received and checked."""

from __future__ import annotations

import msgspec


class UploadView(msgspec.Struct, kw_only=True):
    """PUT /mirror/uploads/{sha256}: one file of an import, received and checked."""

    sha256: str
    size: int
