"""What a step's lifecycle works through: `Site` — the ledger's `Core` (log, storage,
clock, options, guard), the registered places (`ledger.workspace.places.Places`) and
the leases (`ledger.workspace.leases.Leases`). Handed down by the facades
(`ledger.workspaces`, `Ledger`); never the `Ledger` itself."""

from __future__ import annotations

from dataclasses import dataclass

from ..workspace.core import Core
from ..workspace.leases import Leases
from ..workspace.places import Places


@dataclass(frozen=True, slots=True)
class Site:
    """The ledger's core, its workspaces' places and their leases (see the module)."""

    core: Core
    places: Places
    leases: Leases

    @classmethod
    def of(cls, core: Core) -> Site:
        places = Places(core)
        return cls(core, places, Leases(core, places))

    def held(self, digest: str) -> bool:
        """Whether the ledger holds these bytes (a temporary of this digest may go)."""
        return self.core.blob_size(digest) is not None


__all__ = ["Site"]
