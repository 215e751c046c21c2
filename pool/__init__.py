"""The Data Pool: ClickHouse (embedded chDB or a server) behind one store, its schema, SQL API and CLI."""
