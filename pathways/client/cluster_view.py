"""What a client knows of the cluster: its devices and hosts, and the newest mapping of each of
its own slices.

The coordinator lists the devices (``ListDevices``: id, island, host, kind, HBM, the data
address of its host); the view keeps the last list and fetches it again on ``refresh``, which
the client calls whenever the cluster may have changed (a new mesh, a remap, a resume). A slice
whose devices changed (a remap, a resume) gets a mesh of a higher version; ``current`` maps a
mesh of any older version onto it, so arrays, compiled functions and programs built on the old
mesh follow their slice.
"""

from __future__ import annotations

from .. import protocol
from ..errors import PathwaysError
from ..program.mesh import Device, Mesh, device_of

__all__ = ["ClusterView"]


class ClusterView:
    """The devices as the coordinator last listed them (asked through ``session``, waiting at
    most ``timeout`` seconds), and this client's slices by id in their newest mapping."""

    def __init__(self, session, timeout: float):
        self._session, self._timeout = session, timeout
        self._devices: dict[int, dict] = {}  # device id -> the coordinator's record of it
        self._meshes: dict[int, Mesh] = {}  # slice id -> its newest mapping (after remap)

    # ---- devices and hosts ---------------------------------------------------------------
    def refresh(self) -> None:
        """Ask the coordinator for the devices again."""
        infos = self._session.request(self._session.address, protocol.ListDevices(None)
                                      ).result(self._timeout)
        self._devices = {d["id"]: d for d in infos}

    def devices(self) -> list[Device]:
        """Every device, as the coordinator lists them now."""
        self.refresh()
        return [device_of(d) for d in self._devices.values()]

    def listed(self) -> list[Device]:
        """Every device as of the last refresh (no round trip to the coordinator)."""
        return [device_of(d) for d in self._devices.values()]

    def hosts(self) -> dict:
        """Host id -> its data address, as the coordinator lists them now."""
        self.refresh()
        return {info["host"]: info["data"] for info in self._devices.values()}

    def __contains__(self, device) -> bool:
        """Whether ``device`` was on a live host at the last refresh."""
        return device in self._devices

    def data_address(self, device) -> str:
        """Where the host of ``device`` takes data requests; ``PathwaysError`` if it was not
        on a live host at the last refresh."""
        try:
            return self._devices[device]["data"]
        except KeyError:
            raise PathwaysError(f"device {device} is not on a live host") from None

    def data_addresses(self) -> set:
        """The data address of every host known at the last refresh."""
        return {d["data"] for d in self._devices.values()}

    def host_of(self, device) -> int:
        return self._devices[device]["host"]

    def hbm(self, device) -> int | None:
        """The HBM bytes of ``device`` (None: unknown)."""
        return self._devices.get(device, {}).get("hbm")

    def hosts_and_islands(self) -> tuple[dict, dict]:
        """Device id -> its host id, and device id -> its island (what lowering places by)."""
        return ({d: info["host"] for d, info in self._devices.items()},
                {d: info["island"] for d, info in self._devices.items()})

    # ---- this client's slices --------------------------------------------------------------
    def adopt(self, mesh: Mesh) -> None:
        """``mesh`` is the newest mapping of its slice (after a remap or resume)."""
        self._meshes[mesh.slice_id] = mesh

    def current(self, mesh: Mesh) -> Mesh:
        """The newest mapping of ``mesh``'s slice: ``mesh`` itself unless it was remapped."""
        cur = self._meshes.get(mesh.slice_id) if mesh.slice_id is not None else None
        return cur if cur is not None and cur.version > mesh.version else mesh

    def slice_versions(self) -> tuple:
        """(slice id, version) of every remapped slice, sorted: what a cache keys on so an
        entry made before a remap is not used after it. Empty while no slice was remapped."""
        return tuple(sorted((sid, m.version) for sid, m in self._meshes.items()))
