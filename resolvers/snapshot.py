"""Write the schema snapshot: ``python -m resolvers.snapshot``."""

from __future__ import annotations

from resolvers.schema import SNAPSHOT, build_schema
from services.settings import Settings

if __name__ == "__main__":
    SNAPSHOT.write_text(str(build_schema(Settings())) + "\n")
    print(f"wrote {SNAPSHOT}")
