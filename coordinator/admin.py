"""What only admins do: retire devices, drain hosts, adopt network candidates."""
from __future__ import annotations

from device_loop.core.durations import iso

from .errors import conflict, not_found
from .leases import Leases
from .notify import host_key
from .store import UniqueViolation


class Admin(Leases):
    async def retire(self, name: str, admin: str, retired: bool = True, force: bool = False) -> dict:
        """Take a device out of the lab (a live lease is revoked only with ``force``), or bring it back."""
        async with self.store.tx():
            device = await self.store.device(name)
            if device is None:
                raise not_found("device", name)
            lease_id = device["lease_id"]
            if retired and lease_id and not force:
                raise conflict("leased", f"{name} is leased by {device['holder']}; retiring it with --force "
                                         "revokes that lease")
            if retired and lease_id:
                device = await self._end_lease(await self.store.lease(lease_id), "revoked",
                                               f"device retired by admin {admin}", admin)
            await self._change(device, f"{'retired' if retired else 'returned'} by admin {admin}", admin,
                               {"retired": retired})
            await self._audit(admin, "retire" if retired else "unretire", name, lease_id, {})
        return await self.device_info(name)

    async def drain(self, host_name: str, admin: str, draining: bool = True) -> dict:
        """No new leases on a host's devices (live ones run out), or lift that."""
        async with self.store.tx():
            if await self.store.host(host_name) is None:
                raise not_found("host", host_name)
            await self.store.set_host_draining(host_name, draining)
            await self._audit(admin, "drain" if draining else "undrain", None, None, {"host": host_name})
        return (await self.hosts(only=host_name))[0]

    async def adopt(self, identifier: str, name: str, device_class: str, tags: list[str], admin: str) -> dict:
        """Make a network candidate a device of the host that found it, named ``name``."""
        async with self.store.tx():
            candidate = await self.store.candidate(identifier)
            if candidate is None:
                raise not_found("candidate", identifier)
            if await self.store.device(name) is not None:
                raise conflict("name_taken", f"a device named {name!r} exists already")
            try:
                await self.store.insert_adoption({"identifier": identifier, "name": name, "class": device_class,
                                                  "tags": tags, "host": candidate["host"], "adopted_by": admin,
                                                  "at": self.clock()})
            except UniqueViolation:
                raise conflict("adopted", f"{identifier} is adopted already, or {name!r} is taken") from None
            await self._audit(admin, "adopt", name, None, {"identifier": identifier, "host": candidate["host"]})
            self._notify(host_key(candidate["host"]))
        return {"identifier": identifier, "name": name, "host": candidate["host"],
                "note": f"{name} appears once exporter {candidate['host']} reports it (at its next heartbeat)"}

    async def revoke_token(self, token_id: str, admin: str) -> dict:
        async with self.store.tx():
            token = await self.store.token(token_id)
            if token is None:
                raise not_found("token", token_id)
            if token["revoked_at"] is not None:
                raise conflict("already_revoked",
                               f"token {token_id} was revoked already, at {iso(token['revoked_at'])}")
            await self.store.revoke_token(token_id, self.clock())
            await self._audit(admin, "token_revoke", None, None, {"id": token_id})
        return {"id": token_id, "revoked": True}

    async def record(self, actor: str, action: str, detail: dict) -> None:
        """An admin action that is not about a device or lease (tokens), for the audit log."""
        async with self.store.tx():
            await self._audit(actor, action, None, None, detail)
