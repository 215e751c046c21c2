"""OTLP/HTTP ingest: OpenTelemetry GenAI spans (and the log events that carry their messages) as steps.

``wire`` decodes request bodies with the official protobuf classes, ``genai`` turns spans and log
records into model calls (pure), ``join`` holds message content from logs until its span arrives,
``events`` writes a call as a black-box service ``turn`` event with source kind ``otel``, and ``routes``
serves ``POST /v1/traces`` and ``POST /v1/logs``. docs/otel.md describes the mapping.
"""
