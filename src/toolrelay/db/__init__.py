"""Database access: connections (local or embedded), migrations, identity per transaction."""

from toolrelay.db.connect import Database, resolve_database_url
from toolrelay.db.errors import translate_db_error, translated
from toolrelay.db.migrate import applied_migrations, available_migrations, migrate

__all__ = [
    "Database",
    "applied_migrations",
    "available_migrations",
    "migrate",
    "resolve_database_url",
    "translate_db_error",
    "translated",
]
