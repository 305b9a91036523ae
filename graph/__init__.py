"""The only place with Cypher: driver helpers, migrations and one module per aggregate."""
