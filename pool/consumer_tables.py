"""Pool tables owned by the consumer SDK (group commits, curation presets), run by the pool's migrations."""

CONSUMER_MIGRATIONS: list[tuple[str, str]] = []
