"""Master-key rotation (E1): re-wrap every Bot data key with the current master key.

Content ciphertexts never change. Every process first learns the new key as a previous one (a
rolling restart), then takes it as current with the old one as previous (a second one): a process
that knew only the old key could not read the Bots a process already on the new key created. Run
it once every process has the new key as current; reads keep working throughout (no downtime).
README.md has the steps.
"""

from __future__ import annotations

from neo4j import AsyncDriver

from graph import bots as bots_q
from graph.driver import read, write
from services.crypto import DecryptionError, Keyring, WrappedKey


async def rotate_data_keys(driver: AsyncDriver, keyring: Keyring) -> int:
    """Re-wrap each Bot data key not yet wrapped by the current master key; returns how many changed."""
    changed = 0
    for row in await read(driver, bots_q.all_bot_keys):
        old = WrappedKey(row["master"], bytes(row["wrapped"]))
        if old.master_id == keyring.current_id:
            continue
        try:
            new = keyring.rewrap(row["id"], old)
        except DecryptionError:
            continue  # wrapped by a key this process does not know: left as it is, counted by unrotated
        done = await write(
            driver,
            lambda tx, row=row, old=old, new=new: bots_q.rewrap_bot_key(
                tx, id=row["id"], old_master=old.master_id, new_master=new.master_id, new_wrapped=new.wrapped
            ),
        )
        changed += int(done)
    return changed


async def unrotated(driver: AsyncDriver, keyring: Keyring) -> int:
    """How many Bot data keys are not wrapped by the current master key (a rotation not finished,
    or Bots created by a process that still had the older key as current)."""
    rows = await read(driver, bots_q.all_bot_keys)
    return sum(1 for row in rows if row["master"] != keyring.current_id)
