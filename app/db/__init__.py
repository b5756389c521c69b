"""Database access: tables, engine, repositories, the embedded cluster and migrations."""
