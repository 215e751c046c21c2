"""The core every role imports: settings, topic names, Kafka clients, conversation keys, metrics.

Nothing here imports a role or the application layer (``clawr1.cli``, ``clawr1.stack``), so the
arrows of the house run one way: app -> roles -> core.
"""
